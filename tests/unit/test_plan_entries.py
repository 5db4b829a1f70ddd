"""A plan mistake is reported at its plan entry, whatever the planned module's class
(localize/plans.py): the culprit value is walked back through code the reference shares to the
planned module it leaves; an entry whose declared layout the value's proven relation contradicts
is the culprit before one that merely asks for a layout its value has; a line the reference does
not run stops the walk. Checked on a hand-made residual block, x + mlp(x), with the relations a
saturation would prove, and on the layouts capture reads from torch's parallel styles."""

from __future__ import annotations

from shardproof.graph.model import Frame, Graph, Node, Placeholder, PlanLayouts, SourceSite, TensorMeta
from shardproof.localize.context import Context
from shardproof.localize.evidence import Evidence
from shardproof.localize.plans import FalseClaim
from shardproof.results import Discrepancy, Site
from shardproof.verify.engine import Facts
from shardproof.verify.relations_found import RelationIndex

MODEL, PLAN = "/project/model.py", "/project/plan.py"
META = TensorMeta((2, 8, 16), "float32")
# model.py: 10 `return x + self.mlp(x)`, 20 `return self.down(self.up(x))` (MLP.forward),
# 30 a line only the parallel program runs (its own reshape)
BLOCK, MLP_FORWARD, PARALLEL_ONLY = 10, 20, 30
ENTRY_LINES = {"mlp.up": 41, "mlp.down": 42, "mlp": 43}


def _site(*lines: int) -> SourceSite:
    return SourceSite(tuple(Frame(MODEL, line, "forward", column=4, end_line=line, end_column=30) for line in lines))


def _node(value: str, op: str, inputs: tuple[str, ...], module: str, kind: str, *lines: int) -> Node:
    return Node(value, op, inputs, {}, META, _site(*lines), module, kind)


LINEAR = "torch.nn.modules.linear.Linear"


def _graph(
    name: str, rank: int | None, *, user_reshape: bool = False, normed_up: bool = False, layouts: dict | None = None
) -> Graph:
    nodes = [
        _node("up", "linear", ("x", "w_up"), "mlp.up", LINEAR, BLOCK, MLP_FORWARD),
        _node("down", "linear", ("up", "w_down"), "mlp.down", LINEAR, BLOCK, MLP_FORWARD),
    ]
    if normed_up and rank is not None:  # MLP.forward normalizes up's output (a value no output reads)
        nodes.insert(1, _node("normed", "unary", ("up",), "mlp", "MLP", BLOCK, MLP_FORWARD))
    summed = "down"
    if user_reshape:
        nodes.append(_node("reshaped", "view", ("down",), "", "Block", PARALLEL_ONLY))
        summed = "reshaped"
    nodes.append(_node("out", "binary", ("x", summed), "", "Block", BLOCK))
    placeholders = [
        Placeholder("x", "input", "0", META),
        Placeholder("w_up", "parameter", "mlp.up.weight", META),
        Placeholder("w_down", "parameter", "mlp.down.weight", META),
    ]
    graph = Graph(name, rank, 2, placeholders, nodes, ["out"])
    if rank is not None:
        graph.plan_entries = {
            path: Frame(PLAN, line, "Style", f'"{path}": ...', 8, line, 14) for path, line in ENTRY_LINES.items()
        }
        graph.plan_layouts = (
            layouts
            if layouts is not None
            else {
                "mlp.up": PlanLayouts(input_claims=("Replicate()",), outputs=("Shard(-1)",)),
                "mlp.down": PlanLayouts(input_claims=("Shard(-1)",), outputs=("Partial()",)),
                # PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate())
                "mlp": PlanLayouts(output_claims=("Replicate()",), outputs=("Replicate()",)),
            }
        )
    return graph


def _context(**kwargs) -> Context:
    reference = _graph("reference", None)
    ranks = [_graph(f"rank{r}", r, **kwargs) for r in range(2)]
    classes = {"reference/x": 1, "reference/up": 2, "reference/down": 3, "reference/out": 4}
    facts = Facts(classes=classes)
    for r, graph in enumerate(ranks):
        classes[f"{graph.name}/x"] = 1  # the input: replicated
        if "normed" in graph.node_map():
            classes[f"{graph.name}/up"] = 2  # up: whole on every rank (colwise_rep)
            classes[f"{graph.name}/normed"] = 40 + r  # unrelated to anything the reference computes
        else:
            classes[f"{graph.name}/up"] = 10 + r
            facts.sel.append((2, 10 + r, -1, ((16 * r, 16 * r + 16),)))  # up: this rank's 16 of 32 columns
        classes[f"{graph.name}/down"] = 20 + r
        facts.psum.append((3, 20 + r, 16 * r, 16 * r + 16, 32))  # down: a partial sum
        if "reshaped" in graph.node_map():
            classes[f"{graph.name}/reshaped"] = 20 + r
        classes[f"{graph.name}/out"] = 30 + r  # unrelated: the sum was never reduced
    index = RelationIndex(reference, ranks, facts)
    return Context(Evidence(reference, ranks, [{}, {}], index, []))


def _missing_reduction(ctx: Context, culprit: str = "down") -> Discrepancy:
    return Discrepancy(
        kind="missing-reduction",
        message="the partial sum of the linear mlp.down reaches the add without an all-reduce",
        primary=Site(MODEL, MLP_FORWARD, 5, MLP_FORWARD, 31, "return self.down(self.up(x))", note="produced here"),
        parallel_nodes=[f"rank0/{culprit}", "rank0/out"],
        suggestion="all-reduce the partial sums before using them",
        details={"culprit": f"rank0/{culprit}"},
    )


def test_a_value_leaving_planned_modules_crosses_them_outermost_first() -> None:
    crossing = _context().plan_crossing(0, "down")
    assert crossing is not None
    assert crossing.paths == ("mlp", "mlp.down")
    assert crossing.consumer is not None and crossing.consumer.id == "out"


def test_an_entry_whose_declared_output_its_value_contradicts_is_the_culprit() -> None:
    ctx = _context()
    # mlp declares Replicate() but its output is a partial sum; mlp.down truly hands on Partial()
    assert ctx.false_claim(0, "mlp", "down") == FalseClaim("output", "Replicate()", "Partial()")
    assert ctx.false_claim(0, "mlp.down", "down") is None
    found = ctx.with_plan_context(_missing_reduction(ctx))
    assert isinstance(found, Discrepancy) and found.primary is not None
    assert (found.primary.file, found.primary.line) == (PLAN, ENTRY_LINES["mlp"])
    assert "declares `mlp`'s output Replicate()" in found.primary.note
    assert "in the plan entry for `mlp`" in found.suggestion
    assert found.details["plan_entry"]["false_claim"] == {
        "role": "output",
        "declared": "Replicate()",
        "holds": "Partial()",
    }
    # the line that runs the module and the line that used the value stay as related information
    assert [(s.line, s.note) for s in found.related[:2]] == [(BLOCK, "`mlp` runs here"), (MLP_FORWARD, "produced here")]


def test_without_a_false_claim_the_outermost_entry_with_a_say_on_the_output_is_the_culprit() -> None:
    truthful = {
        "mlp.up": PlanLayouts(input_claims=("Replicate()",), outputs=("Shard(-1)",)),
        "mlp.down": PlanLayouts(input_claims=("Shard(-1)",), outputs=("Partial()",)),
        "mlp": PlanLayouts(input_claims=("Replicate()",)),  # PrepareModuleInput: no word on the output
    }
    ctx = _context(layouts=truthful)
    found = ctx.with_plan_context(_missing_reduction(ctx))
    assert isinstance(found, Discrepancy) and found.primary is not None
    assert found.primary.line == ENTRY_LINES["mlp.down"]
    assert "it hands the output on as Partial()" in found.suggestion


def test_an_input_claim_its_value_contradicts_is_false() -> None:
    # PrepareModuleInput(input_layouts=(Partial(),), ...) on a module whose input is replicated
    ctx = _context(layouts={"mlp": PlanLayouts(input_claims=("Partial()",))})
    assert ctx.false_claim(0, "mlp", "down") == FalseClaim("input", "Partial()", "Replicate()")


def test_a_line_only_the_parallel_program_runs_stops_the_walk() -> None:
    ctx = _context(user_reshape=True)
    assert ctx.plan_crossing(0, "reshaped") is None
    user_line = Site(MODEL, PARALLEL_ONLY, 5, PARALLEL_ONLY, 31, "x = x.view(...)")
    found = _missing_reduction(ctx, "reshaped")
    found.primary = user_line
    assert ctx.with_plan_context(found).primary == user_line


def test_a_report_at_a_line_the_parallel_program_alone_runs_stays_there() -> None:
    ctx = _context()
    found = _missing_reduction(ctx)
    found.primary = Site(MODEL, PARALLEL_ONLY, 5, PARALLEL_ONLY, 31, "y = helper(x)")
    found.parallel_nodes = []  # (no operation inside a planned torch module either)
    assert ctx.with_plan_context(found).primary.line == PARALLEL_ONLY


def test_the_layouts_a_style_declares_separate_claims_from_computed_outputs() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    from shardproof.capture.plan_layouts import layouts_of, merged

    # a linear's output layout is computed by DTensor: no claim, only how it leaves
    assert layouts_of(ColwiseParallel(output_layouts=Replicate())) == PlanLayouts(
        input_claims=("Replicate()",), outputs=("Replicate()",)
    )
    assert layouts_of(RowwiseParallel(output_layouts=Partial())).outputs == ("Partial()",)
    # PrepareModuleOutput takes its output_layouts on trust: a claim
    prepared = layouts_of(PrepareModuleOutput(output_layouts=Partial(), desired_output_layouts=Replicate()))
    assert prepared == PlanLayouts(output_claims=("Partial()",), outputs=("Replicate()",))
    prepared_input = layouts_of(
        PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))
    )
    assert prepared_input == PlanLayouts(input_claims=("Shard(1)", None))
    assert layouts_of(SequenceParallel()) == PlanLayouts(input_claims=("Shard(1)",), outputs=("Shard(1)",))
    # PrepareModuleInputOutput applies both halves to one module
    assert merged(prepared_input, prepared) == PlanLayouts(("Shard(1)", None), ("Partial()",), ("Replicate()",))


def test_a_value_computed_from_whole_values_has_their_layout() -> None:
    # up handed on whole (colwise_rep) and normalized in MLP.forward (reference code): the norm's
    # inputs are all whole, so the layout that reached it is up's, decided by up's entry
    whole_up = {"mlp.up": PlanLayouts(input_claims=("Replicate()",), outputs=("Replicate()",))}
    ctx = _context(normed_up=True, layouts=whole_up)
    crossing = ctx.plan_crossing(0, "normed")
    assert crossing is not None and crossing.paths == ("mlp.up",) and crossing.value == "up"
    assert ctx.false_claim(0, "mlp.up", "up") is None  # it is what the entry declares
