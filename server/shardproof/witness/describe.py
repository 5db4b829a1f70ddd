"""Readable lines for a numeric witness (no torch: the language server uses this too)."""

from __future__ import annotations

from typing import Any


def _error(entry: dict[str, Any]) -> str:
    if entry.get("max_abs") is None:
        return entry.get("note") or "not comparable"
    note = f" ({entry['note']})" if entry.get("note") else ""
    return f"max abs error {entry['max_abs']:.3g}, relative {entry['max_rel']:.3g}{note}"


def trials_summary(data: dict[str, Any]) -> str:
    """ "12 trials (3 seeds of random weights; the example inputs, random inputs; float64)"."""
    trials = data.get("trials") or []
    if not trials:
        return "1 trial"
    seeds = sorted({t.get("seed", 0) for t in trials})
    inputs = list(dict.fromkeys(t.get("inputs", "") for t in trials))
    dtypes = list(dict.fromkeys(t.get("dtype", "float64") for t in trials))
    weights = f"{len(seeds)} seed{'' if len(seeds) == 1 else 's'} of random weights"
    return f"{len(trials)} trial{'' if len(trials) == 1 else 's'} ({weights}; {', '.join(inputs)}; {', '.join(dtypes)})"


def headline(data: dict[str, Any] | None) -> str:
    """The witness in one line (the editor's hover, summaries)."""
    lines = describe(data)
    return lines[0] if lines else ""


def describe(data: dict[str, Any] | None) -> list[str]:
    """Readable lines for reports and explanations (shared by the CLI text and the editor)."""
    if not data:
        return []
    status = data.get("status")
    notes = [str(note) for note in data.get("notes", [])]
    if status == "agree":
        gradients = any(str(o.get("where", "")).startswith("gradient") for o in data.get("outputs", []))
        what = "outputs and gradients" if gradients else "outputs"
        inside = data.get("at_module") or {}
        return [
            f"no difference found: the {what} agree within {data.get('tolerance', 1e-6):g} (relative) on "
            f"{trials_summary(data)}; {data.get('seconds', 0.0):.2f} s",
            *(
                [f"at module {inside['where']} the values differ ({_error(inside)}), which the outputs make up for"]
                if inside.get("differs")
                else []
            ),
            *notes,
        ]
    if status != "confirmed":
        return [f"not run: {data.get('reason', 'no numeric witness')}"]
    seed = data.get("seed", 0)
    lines = [
        f"confirmed numerically ({data.get('configuration', 'full')} configuration, {data.get('dtype', 'float64')}, "
        f"random weights (seed {seed}), {data.get('inputs', 'the example inputs')}; {data.get('seconds', 0.0):.2f} s)"
    ]
    if data.get("failure"):
        lines.append(f"{data['failure']}")
    for entry in data.get("outputs", []):
        lines.append(f"{entry['where']}: {_error(entry)}")
    at_module = data.get("at_module")
    if at_module and (at_module.get("max_abs") is not None or at_module.get("note")):
        lines.append(f"at module {at_module['where']}: {_error(at_module)}")
    return lines + notes
