"""`python -m shardproof.server`: the language server over stdio."""

from .main import main

main()
