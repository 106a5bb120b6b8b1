"""Exporting a Hugging Face causal LM as an hf_static program: the static-cache module, the attention it claims,
building from metadata or GGUF, and the tiny models the tests and demos export. Needs torch and transformers."""
