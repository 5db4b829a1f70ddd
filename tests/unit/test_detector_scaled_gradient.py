"""scaled-gradient: a gradient equal to the reference's but for the constant factor carried
outside it. When the loss a rank runs backward from carries the reference's factor times the
number of ranks its gradients are averaged over, the gradients' reduction is reported (summed
where they should be averaged); a loss seeded with another factor is reported at that loss. A
factor of one, a gradient that differs otherwise, or an output that is no gradient, is not this."""

from __future__ import annotations

from fractions import Fraction

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.graph.model import GradientRole
from shardproof.localize.detectors.scaled_gradient import scaled_gradient
from shardproof.verify.factored_terms import SCALED_SUFFIX

SHAPE = (4, 16)
LOSS, REDUCE = 40, 44
MEAN_OF_16, MEAN_OF_8 = Fraction(1, 16), Fraction(1, 8)  # the reference's batch; a rank's half of it


def _kit(
    *, gradient: Fraction, loss: Fraction = MEAN_OF_8, same_unscaled: bool = True, is_gradient: bool = True
) -> Kit:
    """Each program's loss is a mean (its factor `loss` on a rank, 1/16 in the reference), seeded
    by `ones_like(loss)`; a rank all-reduces its local gradient (line 44), which carries `gradient`
    where the reference's carries 1."""
    kit = Kit()
    kit.input("x", *SHAPE)
    for program in kit.programs:
        line = 10 if program.graph.rank is None else LOSS
        program.op("loss", "reduce", "x", out=(), line=line, fn="sum")
        program.op("seed", "constant", out=(), line=line + 1, original="aten::ones_like", like="loss")
        program.op("local", "matmul", "x", "seed", out=SHAPE, line=line + 2)
        kit.factor(f"{program.name}/loss", MEAN_OF_16 if program.graph.rank is None else loss)
    kit.ref.output("local")
    kit.equal("reference/local" + SCALED_SUFFIX)
    kit.ref.graph.gradient_roles = [GradientRole("w") if is_gradient else None]
    for r, rank in kit.each_rank():
        rank.all_reduce("grad", "local", out=SHAPE, line=REDUCE)
        rank.output("grad")
        rank.graph.gradient_roles = [GradientRole("w", "w") if is_gradient else None]
        unscaled = f"rank{r}/grad{SCALED_SUFFIX}"
        if same_unscaled:
            kit.equal("reference/local" + SCALED_SUFFIX, unscaled)
        else:
            kit.cls(unscaled)
        kit.factor(f"rank{r}/grad", gradient)
    return kit


def test_gradients_summed_where_averaged_are_reported_at_the_reduction() -> None:
    found = scaled_gradient(_kit(gradient=Fraction(2)).context(), [0])
    assert found is not None and found.kind == "scaled-gradient"
    assert at(found) == (PARALLEL_FILE, REDUCE) and found.primary.note == "the gradients are reduced here"
    assert found.message.startswith("rank 0's gradient of `w` is 2 × the reference's: ")
    assert "summed where they should be averaged" in found.message
    assert found.found == "2 × that gradient" and found.ranks == [0, 1]
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 12)


def test_a_gradient_divided_twice_reports_its_factor_as_a_fraction() -> None:
    found = scaled_gradient(_kit(gradient=Fraction(1, 2)).context(), [0])
    assert found is not None and "is 1/2 × the reference's" in found.message and found.found == "1/2 × that gradient"


def test_a_loss_seeded_with_the_wrong_factor_is_reported_at_the_loss() -> None:
    # two micro-batch means added up: 1/4 where the rank's half of the batch needs 1/8
    found = scaled_gradient(_kit(gradient=Fraction(2), loss=Fraction(1, 4)).context(), [0])
    assert found is not None and at(found) == (PARALLEL_FILE, LOSS)
    assert found.primary.note == "the loss backward starts from"
    assert "the loss it runs backward from is 2 × what averaging over its items needs" in found.message


def test_a_gradient_with_the_references_factor_is_right() -> None:
    assert scaled_gradient(_kit(gradient=Fraction(1)).context(), [0]) is None


def test_a_gradient_that_differs_otherwise_is_not_only_scaled() -> None:
    assert scaled_gradient(_kit(gradient=Fraction(2), same_unscaled=False).context(), [0]) is None


def test_an_output_that_is_no_gradient_is_not_this_mistake() -> None:
    assert scaled_gradient(_kit(gradient=Fraction(2), is_gradient=False).context(), [0]) is None
