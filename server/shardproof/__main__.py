"""`python -m shardproof ...` is the command-line interface."""

from .cli import run

run()
