"""A tiny Hugging Face Llama sharded by DeepSpeed AutoTP (training mode), against the same model without it."""
