"""The only module that touches egglog's low-level (version-specific) API.

egglog 13.2 (the last release for Python 3.11) is driven through `egglog.bindings.EGraph`:
programs are parsed and run as text, in chunks of at most 16 commands (13.2 is quadratic in the
size of one multi-command program: loading a 20 k-command unit took 1.49 s in chunks of 100,
1.07 s in chunks of 10, 1.25 s one command at a time), and results are read from a frozen copy of
the e-graph.
Upgrading to egglog 14 on Python 3.12 should only touch this file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

CHUNK = 16


def _bindings() -> ModuleType:
    """egglog's bindings, imported when an e-graph is first made (~0.17 s): a process that only
    captures and reads saturations run elsewhere (the sandbox's) never needs them."""
    from egglog import bindings

    return bindings


class EgglogError(RuntimeError):
    """egglog rejected a program or panicked (e.g. an illegal merge of two different shapes)."""


@dataclass
class RunOutcome:
    updated: bool
    seconds: float
    matches: dict[str, int]


@dataclass
class FrozenRows:
    """Rows of one function: inputs and output as opaque, hashable values."""

    input_sorts: list[str]
    rows: list[tuple[tuple[Any, ...], Any]]


class EGraph:
    def __init__(self) -> None:
        self._egraph = _bindings().EGraph()

    def run_text(self, text: str) -> list[Any]:
        try:
            return self._egraph.run_program(*self._egraph.parse_program(text))
        except _bindings().EggSmolError as exc:
            raise EgglogError(str(exc)) from None

    def load(self, commands: Iterable[str]) -> None:
        batch: list[str] = []
        for command in commands:
            batch.append(command)
            if len(batch) >= CHUNK:
                self.run_text("\n".join(batch))
                batch.clear()
        if batch:
            self.run_text("\n".join(batch))

    def push(self) -> None:
        """Save the e-graph as it is now (`pop` returns to it); a few ms for one holding only
        declarations and rules."""
        self.run_text("(push)")

    def pop(self) -> None:
        """Back to the e-graph as the last `push` saved it: every fact and union since is gone."""
        self.run_text("(pop)")

    def run_schedule(self, schedule: str) -> RunOutcome:
        start = time.perf_counter()
        outputs = self.run_text(schedule)
        report = outputs[-1].report
        return RunOutcome(bool(report.updated), time.perf_counter() - start, dict(report.num_matches_per_rule))

    def total_rows(self, excluding: frozenset[str] = frozenset()) -> int:
        outputs = self.run_text("(print-size)")
        return sum(size for name, size in outputs[-1].sizes if name not in excluding)

    def function_rows(self) -> dict[str, FrozenRows]:
        frozen = self._egraph.freeze()
        return {
            name: FrozenRows(
                list(function.input_sorts), [(tuple(r.inputs), r.output) for r in function.rows if not r.subsumed]
            )
            for name, function in frozen.functions.items()
        }

    def to_int(self, value: Any) -> int:
        return self._egraph.value_to_i64(value)

    def to_str(self, value: Any) -> str:
        return self._egraph.value_to_string(value)
