"""The language server: `python -m shardproof.server` or `shardproof serve` (stdio)."""

from __future__ import annotations


def create_server() -> object:
    from .features import register
    from .server import ShardproofLanguageServer

    server = ShardproofLanguageServer()
    register(server)
    return server
