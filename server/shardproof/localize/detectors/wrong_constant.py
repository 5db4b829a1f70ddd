"""wrong-constant: the rank runs the reference's operation on related inputs, with another number
(a scale from the local head count or width, a divisor, an epsilon). The fix is where the number
was computed: the assignment of the name the operation reads (assignments.py), else the
operation's own line. Reads the literal attributes of the rank op that plays the broken value's
part and the relations of its inputs."""

from __future__ import annotations

import math

from ...graph.model import Frame, Node
from ...results import Discrepancy, Site
from ..assignments import assignment_of_used_name
from ..constant_origin import constant_origin, widest_on_line
from ..context import Context
from ..kept_numbers import kept_factor
from ..sites import to_site
from ..wording import describe_op

# literal attributes that are numbers the program computed (not structure: dims, shapes)
_NUMBERS = {"scalar": ("value",), "fill": ("value",), "sdpa": ("scale",)}


def wrong_constant(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    keys = _NUMBERS.get(ref_node.op)
    aligned = ctx.aligned(ref_node, rank) if keys else None
    if aligned is None or aligned.op != ref_node.op or aligned.attrs.get("fn") != ref_node.attrs.get("fn"):
        return None
    differing = [k for k in keys or () if _differ(ref_node.attrs.get(k), aligned.attrs.get(k))]
    if not differing:
        return None
    related = [
        ctx.relations_between(ref_value, rank, value)
        for ref_value, value in zip(ref_node.inputs, aligned.inputs, strict=False)
    ]
    if len(aligned.inputs) != len(ref_node.inputs) or not all(related):
        return None  # an input is wrong too: not (only) the number
    key = differing[0]
    expected, used = ref_node.attrs.get(key), aligned.attrs.get(key)
    frame = ctx.rank_frame(aligned)
    op_site = ctx.rank_site(aligned, f"the {describe_op(aligned)} uses it here")
    traced = _traced_origin(ctx, aligned, frame, rank, expected, used)
    assigned = assignment_of_used_name(frame) if frame is not None and traced is None else None
    if traced is not None:
        primary, related_sites, name = traced[0], [s for s in [op_site] if s is not None and traced[0] != s], traced[1]
    elif assigned is not None:
        primary = ctx.site_at(assigned, f"{assigned.name} is computed here")
        related_sites, name = [s for s in [op_site] if s is not None], assigned.name
    else:
        primary, related_sites, name = op_site, [], None
    what = "scale" if key == "scale" else "number"
    return Discrepancy(
        kind="wrong-constant",
        message=f"rank {rank} computes the reference's {describe_op(ref_node)} with the {what} {_show(used)} "
        f"where the reference uses {_show(expected)}" + (f" ({name})" if name is not None else ""),
        primary=primary,
        reference=ctx.ref_site(ref_node, f"the reference uses {_show(expected)} here"),
        related=related_sites,
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{aligned.id}"],
        expected=f"{_show(expected)}, as the reference computes it (from the full sizes, not this rank's share)",
        found=_show(used),
        suggestion="compute the number from the whole model's sizes (heads, width) rather than this rank's"
        if primary is not op_site
        else f"use {_show(expected)} here",
    )


def _traced_origin(
    ctx: Context, aligned: Node, frame: Frame | None, rank: int, expected: object, used: object
) -> tuple[Site | None, str] | None:
    """Where a number the builder computed from the world size and kept on the module went wrong
    (constant_origin.py): the computation that makes it wrong, or, when only a per-rank share
    could change it (the share is right as a share), the operation that uses it."""
    if frame is None or rank >= len(ctx.ev.rank_numbers):
        return None
    if not isinstance(expected, int | float) or not isinstance(used, int | float):
        return None

    kept = kept_factor(aligned.site, frame, ctx.ev.rank_numbers[rank], float(used))
    if kept is None:
        return None
    step, name = kept
    inverse = not math.isclose(float(used), float(step.value), rel_tol=1e-9)
    if inverse and not expected:
        return None
    target = 1 / float(expected) if inverse else float(expected)
    culprit = constant_origin(step, target)
    if culprit is None:
        return ctx.rank_site(aligned, f"{name} is right as this rank's share; this use needs the whole size"), name
    shown = widest_on_line(step, culprit)
    return to_site(shown.frame, f"{name} is computed from this"), name


def _differ(expected: object, used: object) -> bool:
    if isinstance(expected, int | float) and isinstance(used, int | float):
        return not math.isclose(float(expected), float(used), rel_tol=1e-9, abs_tol=0.0)
    return expected != used and expected is not None and used is not None


def _show(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
