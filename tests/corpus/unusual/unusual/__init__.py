"""Correct parallel programs in the patterns of public frameworks, written for shardproof's tests:
each computes exactly what its sequential reference computes (GROUND_TRUTH.json records a real
gloo run of each), in a way the rules may not cover yet. shardproof must report each `verified` or
`unproven`, never `discrepancy`."""
