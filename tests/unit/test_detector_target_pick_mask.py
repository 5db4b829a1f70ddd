"""wrong-shard of a vocabulary-parallel loss's target logit: rank r holds the logits of classes
[start, end) and must pick each target's logit at `target - start` for the targets in that
interval, the others masked and their picks zeroed before the all-reduce. A mask keeping other
targets is reported at its comparison, a wrong shift at the masked targets, picks not zeroed at
the pick; a pick that does all three right is no finding."""

from __future__ import annotations

from evidence_kit import I64, PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.localize.detectors.target_pick_mask import target_pick_mask

CLASSES, LOCAL = 16, 8  # each of 2 ranks holds the logits of 8 classes
TARGETS = (2, 8)
# parallel.py: 40 `below`, 41 `above`, 42 `outside`, 43 `local = targets - start`,
# 44 `local = local.masked_fill(outside, 0)`, 45 the pick, 46 `picked.masked_fill(outside, 0)`
BELOW, ABOVE, OUTSIDE, SHIFT, FILL, PICK, ZERO = 40, 41, 42, 43, 44, 45, 46


def _kit(masks: dict[int, tuple[int, int, int]] | None = None, *, zeroed: bool = True) -> Kit:
    """Rank r holds classes [8r, 8r + 8) of the logits and masks its targets as `masks[r]` =
    (low, high, shift) says (by default the right interval and shift)."""
    kit = Kit()
    kit.input("targets", *TARGETS, dtype=I64)
    kit.ref.parameter("logits", "logits", *TARGETS, CLASSES)
    kit.ref.op("pick", "pick", "logits", "targets", out=TARGETS, line=10, dim=-1)
    kit.ref.output("pick")
    for r, rank in kit.each_rank():
        rank.parameter("logits", "logits", *TARGETS, LOCAL)
        kit.sel("logits", f"rank{r}/logits", -1, (LOCAL * r, LOCAL * r + LOCAL))
        low, high, shift = (masks or {}).get(r, (LOCAL * r, LOCAL * r + LOCAL, LOCAL * r))
        rank.op("below", "scalar", "targets", out=TARGETS, dtype="bool", line=BELOW, fn="lt", value=low)
        rank.op("above", "scalar", "targets", out=TARGETS, dtype="bool", line=ABOVE, fn="ge", value=high)
        rank.op("outside", "binary", "below", "above", out=TARGETS, dtype="bool", line=OUTSIDE, fn="or")
        rank.op("shifted", "scalar", "targets", out=TARGETS, dtype=I64, line=SHIFT, fn="sub", value=shift)
        rank.op("local", "fill", "shifted", "outside", out=TARGETS, dtype=I64, line=FILL, value=0)
        rank.op("pick", "pick", "logits", "local", out=TARGETS, line=PICK, dim=-1)
        last = "pick"
        if zeroed:
            rank.op("zeroed", "fill", "pick", "outside", out=TARGETS, line=ZERO, value=0.0)
            last = "zeroed"
        rank.all_reduce("total", last, out=TARGETS, line=47)
        rank.output("total")
    return kit


def _check(kit: Kit, rank: int = 1):
    ctx = kit.context()
    return target_pick_mask(ctx, ctx.ref_nodes["pick"], rank)


def test_a_mask_keeping_other_targets_is_reported_at_the_mask() -> None:
    found = _check(_kit({1: (8, 12, 8)}))
    assert found is not None and found.kind == "wrong-shard"
    assert at(found) in {(PARALLEL_FILE, line) for line in (BELOW, ABOVE, OUTSIDE)}
    assert found.message == (
        "vocab-parallel target logit: the mask keeps targets [8:12] but this rank holds classes [8:16]"
    )
    assert found.expected == "rank 1 picks exactly the targets in [8:16] and zeroes the rest"
    assert "(targets < 8) | (targets >= 16)" in found.suggestion
    assert [(s.line, s.note) for s in found.related] == [(PICK, "the pick from classes [8:16]")]
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 10)


def test_a_wrong_bound_is_reported_at_its_comparison() -> None:
    assert at(_check(_kit({1: (8, 12, 8)}))) == (PARALLEL_FILE, ABOVE)
    assert at(_check(_kit({1: (4, 16, 8)}))) == (PARALLEL_FILE, BELOW)


def test_a_wrong_shift_is_reported_at_the_masked_targets() -> None:
    found = _check(_kit({1: (8, 16, 0)}))
    assert found is not None and at(found) == (PARALLEL_FILE, FILL)
    assert found.message == "vocab-parallel target logit: local target ids are shifted by 0 instead of 8"


def test_picks_not_zeroed_outside_the_classes_are_reported_at_the_pick() -> None:
    found = _check(_kit(zeroed=False))
    assert found is not None and at(found) == (PARALLEL_FILE, PICK)
    assert "the logits picked for targets outside [8:16] are not zeroed before the all-reduce" in found.message


def test_a_pick_masked_shifted_and_zeroed_right_is_no_finding() -> None:
    assert _check(_kit(), rank=0) is None
    assert _check(_kit(), rank=1) is None
    assert _check(_kit({0: (0, 4, 0)}), rank=1) is None  # rank 0's mistake is not rank 1's


def test_a_value_that_is_no_pick_is_not_this_mistake() -> None:
    kit = _kit({1: (8, 12, 8)})
    kit.ref.op("probs", "softmax", "logits", out=(*TARGETS, CLASSES), line=11, dim=-1)  # reads the logits
    ctx = kit.context()
    assert target_pick_mask(ctx, ctx.ref_nodes["probs"], 1) is None
