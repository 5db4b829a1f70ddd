"""missing-gradient: a rank that computes no gradient at all for a parameter the reference trains
is reported where its forward detaches the path (its gradient cut), else where it uses the
parameter. A gradient the rank does compute, or an output that is no gradient, is not this."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, Kit, at, site

from shardproof.graph.model import GradientRole
from shardproof.localize.detectors.missing_gradient import missing_gradient

SHAPE = (2, 8, 16)
USE, DETACH = 40, 45


def _kit(*, absent: tuple[int, ...] = (0, 1), detached: bool = False, gradient: bool = True) -> Kit:
    """Output 0 is the gradient of `up.weight` (on a rank, of its `tp_up.weight`, used at line 40);
    the ranks in `absent` compute none; with `detached`, their forward detaches a value at 45."""
    kit = Kit()
    kit.input("x", *SHAPE)
    for program in kit.programs:
        program.parameter("w", "up.weight" if program.graph.rank is None else "tp_up.weight", 16, 16)
        line = USE if program.graph.rank is not None else 10
        program.op("y", "linear", "x", "w", out=SHAPE, line=line, module="up")
        program.op("grad", "matmul", "x", "y", out=(16, 16), line=line)
        program.output("grad")
    kit.ref.graph.gradient_roles = [GradientRole("up.weight")] if gradient else [None]
    for r, rank in kit.each_rank():
        role = GradientRole("up.weight", rank_parameter="tp_up.weight", absent=r in absent)
        rank.graph.gradient_roles = [role if gradient else None]
        if detached and r in absent:
            rank.graph.gradient_cuts = [site(DETACH)]
    return kit


def test_a_detached_path_is_reported_at_the_detach() -> None:
    found = missing_gradient(_kit(detached=True).context(), [0])
    assert found is not None and found.kind == "missing-gradient"
    assert at(found) == (PARALLEL_FILE, DETACH) and found.primary.note == "the gradient stops here"
    assert found.message == (
        "rank 0 computes no gradient for `tp_up.weight` (the reference trains `up.weight`): its forward detaches "
        "the value the gradient flows through"
    )
    assert found.ranks == [0, 1] and found.found == "no gradient (zeros)" and found.reference_node == "grad"


def test_without_a_detach_the_parameters_use_is_reported() -> None:
    found = missing_gradient(_kit(absent=(1,)).context(), [0])
    assert found is not None and at(found) == (PARALLEL_FILE, USE)
    assert found.message.startswith("rank 1 computes no gradient for `tp_up.weight`")
    assert "frozen or takes no part in the loss" in found.message and found.ranks == [1]


def test_a_gradient_every_rank_computes_is_not_missing() -> None:
    assert missing_gradient(_kit(absent=()).context(), [0]) is None


def test_an_output_that_is_no_gradient_is_not_this_mistake() -> None:
    assert missing_gradient(_kit(gradient=False).context(), [0]) is None
