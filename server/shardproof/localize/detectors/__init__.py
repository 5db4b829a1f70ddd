"""The localizer's detectors: one discrepancy kind (or one family of kinds) per module, each behind
one interface, tried in the order `localize/diagnose.py` documents.

A detector reads the evidence through the localizer's `Context` and returns the discrepancy it
builds, or None when it does not apply (it is not its kind of mistake). Program detectors look at
the whole program (collective calls, stages, gradients); value detectors look at the first
reference value that a rank stops computing (the broken value) on one rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...graph.model import Node
    from ...results import Discrepancy, Unsupported
    from ..context import Context


@dataclass(frozen=True)
class ProgramDetector:
    name: str  # the kinds it reports
    reads: str  # the evidence it reads
    find: Callable[[Context, list[int]], Discrepancy | Unsupported | None]  # (context, failing outputs)


@dataclass(frozen=True)
class ValueDetector:
    name: str
    reads: str
    find: Callable[[Context, Node, int], Discrepancy | Unsupported | None]  # (context, broken value, rank)
