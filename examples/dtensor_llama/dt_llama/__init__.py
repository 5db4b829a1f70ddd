"""A torchtitan-style Llama parallelized with DTensor's `parallelize_module`."""
