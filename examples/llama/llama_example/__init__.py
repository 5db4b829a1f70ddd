"""A small Llama-style model and its Megatron-style tensor-parallel version, used as
shardproof's bundled example. Original code written for shardproof."""
