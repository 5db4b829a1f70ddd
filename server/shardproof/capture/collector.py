"""Python's cyclic garbage collector, paused while a program is captured.

A capture allocates millions of small objects (FX nodes, fake tensors, block records) and frees
few cycles, so the collector runs often and finds little; each collection of its oldest
generation walks every object alive, torch's modules and the model built on meta tensors included,
and in a forked capture process it also copies every page it touches. Paused for the capture,
about 1.5 s of the 405B-shape check at TP=8 (~12 %) is saved (BENCHMARKS, ninth session). What a
paused capture leaves in cycles is freed by the first collection after it; a forked process that
captures ranks inherits the pause and frees everything when it exits.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside (nested pauses keep it paused until the outermost ends)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
