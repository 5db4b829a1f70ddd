"""A split of the reference's layers over ranks that leaves layers to no rank: which reference
modules a rank holds and the line that attached them (capture/placement.py), the bounds of the
slice that selected them (source_map/selection.py), and the report at the bound that is wrong
(localize/stages.py)."""

from __future__ import annotations

import inspect

from torch import nn

from shardproof.capture.placement import placements, recording_attachments
from shardproof.graph.model import Frame, Graph, ModulePlacement, Node, Placeholder, SourceSite, TensorMeta
from shardproof.localize.stages import missing_layers
from shardproof.relations.expr import ParamRef
from shardproof.source_map.selection import slice_selection


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, 2)
        self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(4))


class _Stage(nn.Module):
    def __init__(self, reference: _Decoder, rank: int, per_stage: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(reference.layers[rank * per_stage : (rank + 1) * per_stage])
        self.embed = reference.embed if rank == 0 else None
        self.own = nn.Linear(2, 2)  # not the reference's: not a placement


def _line_of(text: str) -> int:
    source, first = inspect.getsourcelines(_Stage)
    return first + next(i for i, line in enumerate(source) if text in line)


def test_the_ranks_hold_the_reference_modules_attached_at_the_assignment() -> None:
    reference = _Decoder()
    original = nn.Module.__setattr__
    with recording_attachments(reference) as attached:
        stage = _Stage(reference, 1, 2)
    assert nn.Module.__setattr__ is original  # the hook is gone once nothing records
    found = placements(stage, reference, attached)
    assert [(p.path, p.reference) for p in found] == [("layers.0", "layers.2"), ("layers.1", "layers.3")]
    assert {p.site.innermost.line for p in found if p.site and p.site.innermost} == {_line_of("self.layers =")}


def test_the_first_stage_holds_the_embedding_too_and_nothing_inside_a_placed_module_repeats() -> None:
    reference = _Decoder()
    with recording_attachments(reference) as attached:
        stage = _Stage(reference, 0, 2)
    found = placements(stage, reference, attached)
    assert [(p.path, p.reference) for p in found] == [
        ("layers.0", "layers.0"),
        ("layers.1", "layers.1"),
        ("embed", "embed"),
    ]
    embed = found[-1].site
    assert embed is not None and embed.innermost is not None and embed.innermost.line == _line_of("self.embed =")


_STAGES = """\
def split(reference, rank, world_size):
    per_stage = len(reference.layers) // world_size
    start = rank * per_stage
    layers = reference.layers[start : start + per_stage]
    per_stage = 0
    return layers, reference.layers[rank * per_stage : (rank + 1) * per_stage], reference.layers[rank:]
"""


def test_a_slice_names_the_assignments_of_its_start_and_of_its_length() -> None:
    selection = slice_selection(_STAGES, 4)
    assert selection is not None and selection.sequence == "reference.layers"
    assert [(d.name, d.span.line) for d in selection.offset] == [("start", 3)]
    assert [(d.name, d.span.line, d.code) for d in selection.length] == [
        ("per_stage", 2, "per_stage = len(reference.layers) // world_size")
    ]


def test_a_slice_without_a_name_of_its_own_in_the_upper_bound_reads_the_length_from_its_local_names() -> None:
    selection = slice_selection(_STAGES, 6)
    assert selection is not None
    # the last assignment before the line; `rank` is a parameter, not an assignment
    assert [(d.name, d.span.line) for d in selection.length] == [("per_stage", 5)]
    assert [(d.name, d.span.line) for d in selection.offset] == [("per_stage", 5)]


def test_a_line_without_a_bounded_slice_has_no_selection() -> None:
    assert slice_selection(_STAGES, 2) is None
    assert slice_selection("x = (", 1) is None  # a file that does not parse


def _graphs(blocks: list[list[int]], file: str) -> tuple[Graph, list[Graph], list[dict]]:
    meta = TensorMeta((2, 2), "float32")
    placeholders = [Placeholder(f"p{i}", "parameter", f"layers.{i}.weight", meta) for i in range(4)]
    nodes = [Node(f"n{i}", "linear", ("x", f"p{i}"), {}, meta) for i in range(4)]
    reference = Graph("reference", None, 1, placeholders, nodes, ["n3"])
    site = SourceSite((Frame(file, 4, "split", "layers = reference.layers[start : start + per_stage]", 4),))
    ranks, values = [], []
    for rank, indices in enumerate(blocks):
        graph = Graph(f"rank{rank}", rank, len(blocks), [], [], [])
        graph.placements = [ModulePlacement(f"layers.{k}", f"layers.{i}", site) for k, i in enumerate(indices)]
        ranks.append(graph)
        values.append(
            {
                f"layers.{k}.weight": ParamRef(name=f"layers.{i}.weight", shape=(2, 2), dtype="float32")
                for k, i in enumerate(indices)
            }
        )
    return reference, ranks, values


def test_stages_too_short_are_blamed_on_the_length(tmp_path) -> None:
    source = tmp_path / "stages.py"
    source.write_text(_STAGES)
    finding = missing_layers(*_graphs([[0], [1]], str(source)))
    assert finding is not None and finding.kind == "missing-layers"
    assert finding.message.startswith("no rank runs layers.2-3 of the reference's 4 layers")
    assert finding.primary is not None and finding.primary.line == 2
    assert [s.line for s in finding.related] == [4]
    assert finding.reference_node == "n2"


def test_stages_that_overlap_are_blamed_on_the_start(tmp_path) -> None:
    source = tmp_path / "stages.py"
    source.write_text(_STAGES)
    finding = missing_layers(*_graphs([[0, 1], [1, 2]], str(source)))
    assert finding is not None and finding.primary is not None and finding.primary.line == 3
    assert finding.found == "rank 0 runs layers.0-1; rank 1 runs layers.1-2"


def test_a_split_that_covers_every_layer_or_ranks_with_their_own_modules_say_nothing(tmp_path) -> None:
    assert missing_layers(*_graphs([[0, 1], [2, 3]], str(tmp_path / "stages.py"))) is None
    reference, ranks, _ = _graphs([[0], [1]], str(tmp_path / "stages.py"))
    assert missing_layers(reference, ranks, [{}, {}]) is None  # no rank holds any reference parameter


def test_without_the_source_the_report_stays_at_the_line_that_attached_the_layers(tmp_path) -> None:
    finding = missing_layers(*_graphs([[0], [1]], str(tmp_path / "gone.py")))
    assert finding is not None and finding.primary is not None
    assert (finding.primary.line, finding.primary.note) == (4, "selects each stage's layers")


def test_a_rank_that_runs_no_layer_is_reported_at_the_line_that_selects_them(tmp_path) -> None:
    source = tmp_path / "stages.py"
    source.write_text(_STAGES)
    finding = missing_layers(*_graphs([[0, 1], []], str(source)))
    assert finding is not None and "rank 1 runs none of them" in finding.message
    assert finding.primary is not None
    assert (finding.primary.line, finding.primary.note) == (4, "selects each stage's layers")
