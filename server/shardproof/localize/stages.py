"""Layers no rank runs: a split of the reference's layers over stages that leaves some out.

The ranks hold the reference's own layer modules (capture/placement.py records which, and the
assignment that attached them). When layers of a reference container (`layers.2`, `layers.3`)
have parameters the reference uses and no rank holds any part of, no composition of the stages
can compute the reference's function, and the first broken value (at the last stage) is only a
symptom. The split itself is Python arithmetic: the stages' blocks show which bound is wrong (the
length when the blocks follow each other from layer 0 but fall short, else the offset), and the
slice that selected them (source_map/selection.py) names the assignment of that bound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..graph.model import Frame, Graph, ModulePlacement, Node
from ..relations.expr import Expr, referenced_params
from ..results import Discrepancy, Site
from ..source_map.selection import Definition, SliceSelection, slice_selection
from .sites import to_site


@dataclass
class _Split:
    container: str  # the reference's container of layers (`layers`)
    size: int  # how many layers the reference's container has (that the reference uses)
    blocks: dict[int, list[int]]  # rank -> the container's indices it holds, ascending
    missing: list[int]
    attached: Frame | None  # the user line that attached the layers to a stage
    world_size: int


def missing_layers(reference: Graph, ranks: list[Graph], rank_values: list[dict[str, Expr]]) -> Discrepancy | None:
    """Layers of a reference container whose parameters no rank holds, reported at the bound of
    the split that left them out; None when every used parameter is held somewhere (or nothing
    is: ranks that build their own modules say nothing about a split)."""
    used = _used_parameters(reference)
    held = {name for values in rank_values for expr in values.values() for name in referenced_params(expr)}
    if not held or used <= held:
        return None
    splits = _splits(ranks, used, held)
    return _report(splits[0], reference) if splits else None


def _used_parameters(reference: Graph) -> set[str]:
    read = reference.consumers()
    return {p.target for p in reference.placeholders if p.kind == "parameter" and p.id in read}


def _element(name: str, container: str) -> int | None:
    """The index of `container`'s element that parameter or module `name` belongs to."""
    if not name.startswith(container + "."):
        return None
    head = name[len(container) + 1 :].split(".")[0]
    return int(head) if head.isdigit() else None


def _splits(ranks: list[Graph], used: set[str], held: set[str]) -> list[_Split]:
    placed: dict[str, list[tuple[int, ModulePlacement]]] = {}
    for rank, graph in enumerate(ranks):
        for placement in graph.placements:
            container, _, last = placement.reference.rpartition(".")
            if container and last.isdigit():
                placed.setdefault(container, []).append((rank, placement))
    splits = []
    for container, entries in placed.items():
        parameters: dict[int, set[str]] = {}
        for name in used:
            index = _element(name, container)
            if index is not None:
                parameters.setdefault(index, set()).add(name)
        missing = sorted(i for i, names in parameters.items() if not names & held)
        if not missing:
            continue
        blocks: dict[int, list[int]] = {}
        for rank, placement in entries:
            index = _element(placement.reference, container)
            assert index is not None
            blocks.setdefault(rank, []).append(index)
        sites = [p.site.innermost for _, p in entries if p.site is not None and p.site.innermost is not None]
        splits.append(
            _Split(
                container,
                len(parameters),
                {r: sorted(b) for r, b in sorted(blocks.items())},
                missing,
                sites[0] if sites else None,
                len(ranks),
            )
        )
    return splits


def _follow_each_other(blocks: dict[int, list[int]]) -> bool:
    """Every rank's block is contiguous and starts where the previous rank's ends, from 0."""
    expected = 0
    for indices in blocks.values():
        if indices != list(range(expected, expected + len(indices))):
            return False
        expected += len(indices)
    return True


def _names(container: str, indices: list[int]) -> str:
    """`layers.2-3`, `layers.0`, `layers.1, layers.4`."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{container}.{r[0]}" if len(r) == 1 else f"{container}.{r[0]}-{r[-1]}" for r in runs)


def _report(split: _Split, reference: Graph) -> Discrepancy:
    container, blocks = split.container, split.blocks
    runs = "; ".join(f"rank {rank} runs {_names(container, indices)}" for rank, indices in blocks.items())
    idle = [rank for rank in range(split.world_size) if rank not in blocks]
    bound: str | None = None  # the bound of the blocks that is wrong, when it is one
    if idle:
        who = f"rank {idle[0]} runs" if len(idle) == 1 else f"ranks {', '.join(map(str, idle))} run"
        how = f"{who} none of them"
        expected = f"every one of the {split.world_size} ranks runs its block of {container}"
        suggestion = "give every stage its block of the layers"
    elif _follow_each_other(blocks):
        bound = "length"
        lengths = sorted({len(indices) for indices in blocks.values()})
        covered = sum(len(indices) for indices in blocks.values())
        each = f"{lengths[0]} each" if len(lengths) == 1 else f"{lengths[0]} to {lengths[-1]} each"
        how = f"the stages' blocks follow each other but are too short ({each}, {covered} of {split.size} in all)"
        expected = f"the blocks of all {len(blocks)} ranks together cover {container}.0-{split.size - 1}"
        suggestion = (
            "give each stage its share of all the layers (the number of layers divided by the number of stages)"
        )
    else:
        bound = "start"
        how = "the stages' blocks do not start where the previous stage's block ends"
        expected = f"each rank's block of {container} starts where the previous rank's ends, from {container}.0"
        suggestion = "start each stage's block where the previous stage's block ends"
    primary, related = _sites(split.attached, bound)
    missing_name = _names(container, split.missing)
    first_use = _first_use(reference, f"{container}.{split.missing[0]}.")
    return Discrepancy(
        kind="missing-layers",
        message=f"no rank runs {missing_name} of the reference's {split.size} {container}: {how} ({runs})",
        primary=primary,
        reference=to_site(first_use.site.innermost, f"the reference runs {container}.{split.missing[0]} here")
        if first_use is not None and first_use.site is not None
        else None,
        related=related,
        ranks=list(blocks),
        reference_node=first_use.id if first_use is not None else "",
        expected=expected,
        found=runs,
        suggestion=suggestion,
    )


def _selection(attached: Frame) -> SliceSelection | None:
    try:
        text = Path(attached.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return slice_selection(text, attached.line)


def _definition_site(frame: Frame, definition: Definition, note: str) -> Site:
    """The site of `definition`'s assignment, in the function of `frame`."""
    span = definition.span
    moved = replace(
        frame,
        line=span.line,
        column=span.column,
        end_line=span.end_line,
        end_column=span.end_column,
        code=definition.code,
    )
    site = to_site(moved, note)
    assert site is not None
    return site


def _sites(attached: Frame | None, bound: str | None) -> tuple[Site | None, list[Site]]:
    """The assignment of the wrong bound (where the fix belongs) and the line that selects the
    layers; the selection itself when no bound is to blame or its bounds read no local assignment."""
    if attached is None:
        return None, []
    selecting = to_site(attached, "selects each stage's layers")
    selection = _selection(attached) if bound is not None else None
    if selection is None:
        return selecting, []
    blamed = selection.length if bound == "length" else selection.offset
    if not blamed:
        return selecting, []
    note = f"the {bound} of each stage's block of {selection.sequence}"
    sites = [_definition_site(attached, d, note) for d in blamed]
    assert selecting is not None
    return sites[0], [*sites[1:], selecting]


def _first_use(reference: Graph, prefix: str) -> Node | None:
    placeholders = {p.id for p in reference.placeholders if p.kind == "parameter" and p.target.startswith(prefix)}
    for node in reference.nodes:
        if placeholders & set(node.inputs):
            return node
    return None
