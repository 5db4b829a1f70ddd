"""A discrepancy, explained in Markdown: rendered from the stored result, never by re-verifying."""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path

from ..results import DISCREPANCY_KINDS, Discrepancy, Site
from ..witness.describe import describe as describe_witness

_FRACTIONS = {2: "half", 3: "third", 4: "quarter", 8: "eighth", 16: "sixteenth"}


def fraction_words(width: int, total: int) -> str:
    """`its quarter of the 128` for 32 of 128."""
    if total <= 0:
        return f"{width}"
    share = Fraction(width, total)
    if share.numerator == 1 and share.denominator in _FRACTIONS:
        return f"its {_FRACTIONS[share.denominator]} of the {total}"
    return f"{width} of the {total}"


def _holding_text(text: str) -> str:
    """`a partial sum over [0:32] of the 128 input features` -> `... over its quarter of the 128 ...`."""
    match = re.search(r"over \[(\d+):(\d+)\] of the (\d+) ([\w ]+)", text) or re.search(
        r"over its ([\w ]+) \[(\d+):(\d+)\] of (\d+)", text
    )
    if match is None:
        return text
    if match.re.pattern.startswith("over \\["):
        start, end, total, what = int(match[1]), int(match[2]), int(match[3]), match[4]
    else:
        what, start, end, total = match[1], int(match[2]), int(match[3]), int(match[4])
    return f"a partial sum over {fraction_words(end - start, total)} {what} ([{start}:{end}])"


def _link(site: Site, root: Path | None) -> str:
    name = os.path.relpath(site.file, root) if root else os.path.basename(site.file)
    column = f":{site.column}" if site.column else ""
    uri = Path(site.file).as_uri() + f"#L{site.line}"
    return f"[{name}:{site.line}{column}]({uri})"


def _code(site: Site) -> str:
    return f" `{site.code}`" if site.code else ""


def explain(d: Discrepancy, check: str = "", world_sizes: list[int] | None = None, root: Path | None = None) -> str:
    sizes = ", ".join(str(w) for w in (world_sizes or []))
    where = f"check `{check}`" + (f", world size {sizes}" if sizes else "") if check else ""
    if d.details.get("suspected"):
        return _explain_unproven(d, where, root)
    lines = [f"## {d.kind}" + (f" — {where}" if where else ""), "", f"**{d.message}**", ""]
    if d.reference:
        lines += [
            f"**What the reference computes.** {_link(d.reference, root)}{_code(d.reference)}"
            + (f" — {d.reference.note}" if d.reference.note else ""),
            "",
        ]
    holdings = d.details.get("holdings") if d.details else None
    if holdings:
        lines += ["**What each rank holds.**", ""]
        lines += [f"- rank {rank}: {_holding_text(text)}" for rank, text in holdings.items()]
        lines.append("")
    elif d.found:
        lines += [f"**What the ranks hold.** {_holding_text(d.found)}", ""]
    if d.expected:
        lines += [f"**Expected.** {d.expected}", ""]
    lines += [
        f"**Why it differs.** {DISCREPANCY_KINDS.get(d.kind, d.kind).capitalize()}."
        + (f" Ranks involved: {', '.join(str(r) for r in d.ranks)}." if d.ranks else ""),
        "",
    ]
    lines += _code_sites(d, root, d.primary_role)
    witness_lines = describe_witness(d.witness)
    if witness_lines:
        lines += [f"**Numeric witness.** {witness_lines[0].capitalize()}.", ""]
        lines += [f"- {line}" for line in witness_lines[1:]]
        lines.append("")
    if d.suggestion:
        lines += [f"**Suggested fix.** {d.suggestion}."]
        fix = d.details.get("fix") if d.details else None
        if fix:
            lines[-1] += f" A quick fix is available: *{fix.get('title', fix.get('action'))}*."
    return "\n".join(lines).rstrip() + "\n"


def _explain_unproven(d: Discrepancy, where: str, root: Path | None) -> str:
    """An unproven finding: what was proven, where the proof stopped, what the rules suspected (not
    shown), every trial of the numeric witness, and what to do."""
    lines = [f"## unproven — {where}" if where else "## unproven", "", f"**{d.message}**", ""]
    lines += [
        "**Not a shown difference.** The rules found no relation for this value, and the numbers did not "
        "show a difference either: the program may be right in a way the rules do not cover yet, or wrong "
        "in a way the trials did not reach.",
        "",
        f"**What the rules suspected** (`{d.kind}`, not shown by the numbers). {d.details['suspected']}",
        "",
    ]
    lines += _code_sites(d, root, "the first value without a proven relation")
    witness = d.witness or {}
    witness_lines = describe_witness(witness)
    if witness_lines:
        lines += [f"**Numeric witness.** {witness_lines[0][0].upper()}{witness_lines[0][1:]}.", ""]
        lines += [f"- {line}" for line in witness_lines[1:]]
        trials = witness.get("trials") or []
        if trials:
            lines += ["", "| seed | inputs | dtype | largest relative error |", "|---|---|---|---|"]
            for trial in trials:
                error = trial.get("max_rel")
                shown = "not a number" if error is None else f"{error:.2g}"
                lines.append(
                    f"| {trial.get('seed', 0)} | {trial.get('inputs', '')} | {trial.get('dtype', '')} | {shown} |"
                )
        lines.append("")
    if d.suggestion:
        lines += [f"**What to do.** {d.suggestion[0].upper()}{d.suggestion[1:]}."]
    return "\n".join(lines).rstrip() + "\n"


def _code_sites(d: Discrepancy, root: Path | None, primary: str) -> list[str]:
    """The finding's code sites as a list of links: its own (labelled `primary`), the reference's,
    the related ones."""
    lines = ["**Code sites.**", ""]
    if d.primary:
        lines.append(f"- {primary}: {_link(d.primary, root)}{_code(d.primary)}")
    if d.reference:
        lines.append(f"- the reference: {_link(d.reference, root)}{_code(d.reference)}")
    for site in d.related:
        note = f" — {site.note}" if site.note else ""
        lines.append(f"- {_link(site, root)}{_code(site)}{note}")
    return [*lines, ""]
