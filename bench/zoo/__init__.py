"""The transformers zoo: every installed transformers model with a built-in tensor-parallel plan,
shrunk to a tiny size, verified by shardproof and run for real on gloo (bench/bench_zoo.py)."""
