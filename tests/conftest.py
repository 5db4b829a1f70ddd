"""Shared fixtures. Slow end-to-end tests (real capture + egglog) are marked `slow`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "llama"
TINY = Path(__file__).resolve().parent / "fixtures" / "tiny"

if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))  # bug_variants

# Every test saturates its own units (the cache's own tests turn it on in a temporary directory);
# the servers and workers the tests start inherit this.
os.environ.setdefault("SHARDPROOF_CACHE_DIR", "off")


@pytest.fixture(scope="session")
def sandbox() -> Iterator[object]:
    from shardproof.verify.sandbox import Sandbox

    with Sandbox(8192) as box:
        yield box


@pytest.fixture(scope="session")
def example_root() -> Path:
    return EXAMPLE


@pytest.fixture(scope="session")
def tiny_root() -> Path:
    return TINY
