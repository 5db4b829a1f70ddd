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


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """Every object alive on entry left out of the collections inside (`gc.freeze`), and handed
    back to the oldest generation on exit (`gc.unfreeze`).

    A run's capture is paused (see `paused`), so everything it made is in the youngest
    generation when verification starts: the first collections after it walk the whole capture
    (graphs, modules on meta tensors, records), 0.5 s at TP=64 on the 405B shape, to find that
    almost all of it is still in use. What verification makes is collected as usual. Nothing is
    lost: on exit the capture's objects are the collector's again, their cycles freed by the next
    collection of the oldest generation."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
