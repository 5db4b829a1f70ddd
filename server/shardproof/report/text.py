"""The human-readable report the CLI prints by default."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..results import CheckResult, Discrepancy, Site, WorldSizeResult
from ..witness.describe import describe as describe_witness

_MARK = {
    "verified": "✔ verified",
    "discrepancy": "✘ discrepancy",
    "unproven": "⚠ unproven",
    "inconclusive": "? inconclusive",
    "error": "! error",
}
# ANSI colours of the verdicts on a terminal (green, red, yellow, magenta, red)
_COLOUR = {"verified": "32", "discrepancy": "31", "unproven": "33", "inconclusive": "35", "error": "31"}


def mark(verdict: str, colour: bool = False) -> str:
    text = _MARK.get(verdict, verdict)
    return f"\033[{_COLOUR[verdict]}m{text}\033[0m" if colour and verdict in _COLOUR else text


def _relative(path: str, root: Path | None) -> str:
    if root is None:
        return path
    try:
        return os.path.relpath(path, root)
    except ValueError:
        return path


def _location(site: Site, root: Path | None) -> str:
    col = f":{site.column}" if site.column else ""
    return f"{_relative(site.file, root)}:{site.line}{col}"


def _excerpt(site: Site, indent: str) -> list[str]:
    """The source line with the site's column range underlined."""
    try:
        with open(site.file, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return [f"{indent}{site.code}"] if site.code else []
    if not 0 < site.line <= len(lines):
        return []
    text = lines[site.line - 1]
    out = [f"{indent}{site.line:>5} | {text}"]
    if site.column:
        start = site.column - 1
        end = (site.end_column - 1) if site.end_column and site.end_line == site.line else len(text)
        end = max(end, start + 1)
        out.append(f"{indent}      | {' ' * start}{'^' * (end - start)}")
    return out


def _discrepancy(d: Discrepancy, root: Path | None, shown: bool = True) -> list[str]:
    """A shown discrepancy (kind, where the fix belongs), or an unproven finding (the first value
    without a relation, the rules' guess, what to do)."""
    lines = [f"    [{d.kind}] {d.message}" if shown else f"    {d.message}"]
    if d.primary:
        where = d.primary_role if shown else "the first value without a proven relation"
        lines.append(f"      at {_location(d.primary, root)}  ({where})")
        lines.extend(_excerpt(d.primary, "      "))
    if d.reference:
        lines.append(f"      reference: {_location(d.reference, root)}  {d.reference.code}")
    for site in d.related:
        note = f"  ({site.note})" if site.note else ""
        lines.append(f"      related:   {_location(site, root)}{note}")
    if shown:
        if d.expected:
            lines.append(f"      expected:  {d.expected}")
        if d.found:
            lines.append(f"      found:     {d.found}")
    elif d.details.get("suspected"):
        lines.append(f"      suspected: [{d.kind}] {d.details['suspected']} (not shown by the numbers)")
    if d.ranks:
        lines.append(f"      ranks:     {', '.join(str(r) for r in d.ranks)}")
    if d.suggestion:
        lines.append(f"      {'fix:       ' if shown else 'to do:     '}{d.suggestion}")
    for index, line in enumerate(describe_witness(d.witness)):
        lines.append(f"      {'witness:' if index == 0 else '        '}   {line}")
    return lines


def _world_size(result: WorldSizeResult, root: Path | None, colour: bool) -> list[str]:
    seconds = sum(result.seconds.values())
    lines = [f"  world size {result.world_size}: {mark(result.verdict, colour)}  ({seconds:.1f} s)"]
    if result.verdict == "verified":
        lines.extend(f"    output {o.index}: {o.description}" for o in result.outputs)
    for d in result.discrepancies:
        lines.extend(_discrepancy(d, root))
    for d in result.unproven:
        lines.extend(_discrepancy(d, root, shown=False))
    for u in result.inconclusive:
        where = f" at {_location(u.site, root)}" if u.site else ""
        lines.append(f"    {u.message}{where}")
    if result.error:
        lines.extend(_error(result.error, root, "    "))
    lines.extend(f"    note: {note}" for note in result.notes)
    return lines


def _error(error: dict[str, Any], root: Path | None, indent: str) -> list[str]:
    lines = [f"{indent}{error['message']}"]
    site = error.get("site")
    if site:
        col = f":{site['column'] + 1}" if site.get("column") is not None else ""
        lines.append(f"{indent}  at {_relative(site['file'], root)}:{site['line']}{col}  {site.get('code', '')}")
    inside = error.get("library_site")
    if inside:
        library = f" ({inside['library']})" if inside.get("library") else ""
        # an installed file by its path inside the installation (packaging/version.py)
        where = inside["file"]
        if inside.get("library"):
            where = re.split(r"[/\\](?:site|dist)-packages[/\\]", where)[-1]
        lines.append(f"{indent}  raised inside{library} at {where}:{inside['line']}  {inside.get('code', '')}")
    return lines


def render(checks: list[CheckResult], root: Path | None = None, colour: bool = False) -> str:
    out: list[str] = []
    for check in checks:
        out.append(f"{check.name}: {mark(check.verdict, colour)}")
        if check.error:
            out.extend(_error(check.error, root, "  "))
        for result in check.results:
            out.extend(_world_size(result, root, colour))
        out.append("")
    return "\n".join(out).rstrip() + "\n"
