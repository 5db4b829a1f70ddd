"""`python -m shardproof.worker`."""

from .main import main

main()
