"""etsdk-hf-static: the hf_static contract, export of Hugging Face causal LMs, and their runner."""
