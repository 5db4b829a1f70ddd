"""A tiny Hugging Face Llama with its built-in tensor-parallel plan, against the same model without it."""
