"""Running an hf_static program: the checked model, conversations over caller-owned state and their step-by-step
generation, the prompt's plan, sampling, stop strings, the context's arithmetic. What every application drives."""
