"""How many processes shardproof runs at once: one per core the process may use."""

from __future__ import annotations

import os


def default_workers() -> int:
    """`SHARDPROOF_JOBS` when set, else the number of cores this process may run on."""
    configured = os.environ.get("SHARDPROOF_JOBS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
