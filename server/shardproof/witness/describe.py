"""Readable lines for a numeric witness (no torch: the language server uses this too)."""

from __future__ import annotations

from typing import Any


def _error(entry: dict[str, Any]) -> str:
    if entry.get("max_abs") is None:
        return entry.get("note") or "not comparable"
    return f"max abs error {entry['max_abs']:.3g}, relative {entry['max_rel']:.3g}"


def describe(data: dict[str, Any] | None) -> list[str]:
    """Readable lines for reports and explanations (shared by the CLI text and the editor)."""
    if not data:
        return []
    if data.get("status") != "confirmed":
        return [f"unconfirmed: {data.get('reason', 'no numeric witness')}"]
    lines = [
        f"confirmed numerically ({data.get('configuration', 'full')} configuration, float64, random weights, "
        f"{data.get('inputs', 'the example inputs')}; {data.get('seconds', 0.0):.2f} s)"
    ]
    for entry in data.get("outputs", []):
        lines.append(f"{entry['where']}: {_error(entry)}")
    at_module = data.get("at_module")
    if at_module and (at_module.get("max_abs") is not None or at_module.get("note")):
        lines.append(f"at module {at_module['where']}: {_error(at_module)}")
    return lines
