"""wrong-handover: a pipeline stage that sends the next stage one input of the reference's next
step (the block's output) where that step also needs another (the residual stream) is reported at
the send. A stage that sends the step's result, a step with no other input, or a program that is
no pipeline, is not this mistake."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.localize.detectors.stage_handover import stage_handover

SHAPE = (2, 8, 16)
SEND = 42


def _kit(*, sends: str = "h", pipeline: bool = True) -> Kit:
    """The reference: `e = embed(x)` (line 9), `h = block(e)` (line 10), `y = e + h` (line 11).
    Rank 0 computes `e` and `h`, and `y` unless it sends `h`, and sends `sends` to rank 1 at line
    42; rank 1 receives it."""
    kit = Kit()
    kit.input("x", *SHAPE)
    kit.ref.op("e", "linear", "x", out=SHAPE, line=9, module="embed")
    kit.ref.op("h", "linear", "e", out=SHAPE, line=10, module="block")
    kit.ref.op("y", "binary", "e", "h", out=SHAPE, line=11, fn="add")
    kit.ref.output("y")
    first, second = kit.ranks
    first.op("e", "linear", "x", out=SHAPE, line=39, module="embed")
    first.op("h", "linear", "e", out=SHAPE, line=40, module="block")
    kit.equal("e", "rank0/e")
    kit.equal("h", "rank0/h")
    if sends == "y":
        first.op("y", "binary", "e", "h", out=SHAPE, line=41, fn="add")
        kit.equal("y", "rank0/y")
    first.op("send", "p2p", sends, out=SHAPE, line=SEND, peer=1, send=True)
    first.output("send")
    second.op("received", "p2p", "x", out=SHAPE, line=50, peer=0, send=False)
    second.output("received")
    if pipeline:
        kit.evidence["outputs_of"] = [1]
    return kit


def _check(kit: Kit, ref_value: str = "y"):
    ctx = kit.context()
    return stage_handover(ctx, ctx.ref_nodes[ref_value], 1)


def test_a_stage_that_drops_the_residual_is_reported_at_the_send() -> None:
    found = _check(_kit())
    assert found is not None and found.kind == "wrong-handover"
    assert at(found) == (PARALLEL_FILE, SEND) and found.primary.note == "what this stage hands on"
    assert found.message == (
        "rank 0 hands rank 1 the output of linear block, but the reference's next step (add) also needs the "
        "output of linear embed: the stage boundary drops it"
    )
    assert found.found == "the output of linear block alone" and "sent to rank 1" in found.expected
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 11)
    assert found.ranks == [0] and found.parallel_nodes == ["rank0/send"]


def test_a_stage_that_sends_the_steps_result_is_right() -> None:
    assert _check(_kit(sends="y")) is None


def test_a_step_that_needs_nothing_else_is_not_this_mistake() -> None:
    kit = _kit()
    kit.ref.op("z", "unary", "h", out=SHAPE, line=12, fn="relu")
    assert _check(kit, "z") is None


def test_a_program_that_is_no_pipeline_has_no_stages() -> None:
    assert _check(_kit(pipeline=False)) is None
