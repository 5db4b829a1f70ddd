"""Capture with repeated blocks traced once (see blocks.py): a skeleton per program, and per
distinct block (template) its graph in the reference and in every rank.

Verification then proves each template on its own, with each rank's inputs assumed to relate to
the reference's as their shapes say (equal, or a block of one dim: sequence parallelism), and the
skeletons with every block call an opaque operation related across programs by what its
template's proof guarantees (`pipeline.verify_memoized`, verify/block_contracts.py). A block
can only be memoized when it is the same computation in every instance (blocks.py records that)
and when its parameters relate to the reference's in the same way in every instance (checked
here), because a template stands for all its instances.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..graph.model import Graph
from ..relations.assumed import Unrelated
from ..relations.expr import Expr
from ..verify.block_contracts import Contract, call_key, contracts, template_of
from . import blocks, collector, dtensor
from .capture_cache import CaptureCache
from .exporting import export_module, mixes_cpu_into_meta
from .fake_pg import fake_rank, group_ranks
from .forked import in_own_fork, map_ranks
from .inline import NotInlined, inline_calls
from .libraries import library_shims
from .normalize import to_graph
from .program import (
    _NOT_BUILT,
    CheckCapture,
    _build_reference,
    _to_meta,
    build_reference_for_ranks,
)
from .project_code import import_roots, project_files, source_files
from .provenance import ProvenanceTracker


@dataclass
class ProgramPieces:
    """One program (the reference or a rank) cut at its blocks."""

    skeleton: Graph
    values: dict[str, Expr]
    instances: list[blocks.BlockInstance]
    templates: dict[str, Graph] = field(default_factory=dict)  # template path -> its graph
    skeleton_record: str | None = None  # the skeleton's record (blocks.ProgramRecord.skeleton)
    # the files its capture read: the project modules its process had imported, and those its
    # operations and parameters came from (what a stored capture is checked against)
    read_files: set[str] = field(default_factory=set)
    # each memoizable instance's parameters as they relate to the reference's (`_Forms`), computed
    # where the program was captured (in parallel with the other ranks), by instance path
    forms: dict[str, str] | None = None
    # the skeleton as traced, every lone module an opaque call (blocks.lone_modules), and each lone
    # module's record and graph by path: what the ranks forked after this one may share
    glue: Graph | None = None
    lone: dict[str, tuple[str, Graph]] = field(default_factory=dict)

    def without_modules(self) -> ProgramPieces:
        """The pieces with only what verification reads of the block instances (paths and
        templates, not their modules and meta arguments): what a forked capture sends back."""
        instances = [replace(i, module=None, args=(), kwargs={}, output_spec=None) for i in self.instances]
        return replace(self, instances=instances)


@dataclass
class TemplateUnit:
    """One template in every program: what `pipeline.verify_memoized` proves."""

    template: str
    reference: Graph
    reference_values: dict[str, Expr]
    ranks: list[tuple[Graph, dict[str, Expr]]]
    instances: list[str]  # the paths it stands for
    # per rank, how its inputs are assumed and its outputs must be proven to relate to the
    # reference's (verify/block_contracts.py)
    contracts: list[Contract] = field(default_factory=list)


@dataclass
class MemoizedCapture:
    reference: ProgramPieces
    ranks: list[ProgramPieces]
    units: list[TemplateUnit]
    stored_ranks: int = 0  # ranks whose stored capture was used (capture_cache.py)

    @property
    def instance_count(self) -> int:
        return sum(len(u.instances) for u in self.units)


class NotMemoizable(Exception):
    """The check is captured the plain way (the reason says why)."""


def capture_memoized(capture: CheckCapture, world_size: int) -> MemoizedCapture:
    """Capture the reference and every rank in pieces; NotMemoizable when that cannot stand for
    the plain capture (no repeated block, instances that differ)."""
    with collector.paused():
        return _capture_memoized(capture, world_size)


def _capture_memoized(capture: CheckCapture, world_size: int) -> MemoizedCapture:
    same_code = capture.check.same_code_reference
    with import_roots(capture.project.python_path):
        pending = None

        def trace_reference() -> None:
            nonlocal pending
            if pending is not None:
                module, reference_values, recorded, meta_inputs = pending
                resolve = group_ranks if same_code else None
                reference = _traced(module, reference_values, recorded, meta_inputs, "reference", None, 1, resolve)
                capture.memoized_reference = (reference, meta_inputs)
                pending = None

        if capture.memoized_reference is None:  # the reference is the same for every world size
            # built and recorded before the ranks (what rules memoization out shows here first),
            # traced while the other processes capture ranks. The same code's reference is the
            # parallel code under a one-rank process group (its collectives are the identity),
            # built, recorded and traced in that one world: what it holds (its groups) lives there
            meta_inputs = _to_meta(capture.example_inputs())
            with fake_rank(0, 1) if same_code else contextlib.nullcontext():
                module, reference_values = _build_reference(capture.build_reference, ProvenanceTracker())
                pending = (module, reference_values, _recorded(module, meta_inputs), meta_inputs)
                warm_up_tracing()
                if same_code:
                    trace_reference()

        meta_inputs = pending[3] if pending is not None else capture.memoized_reference[1]
        traced: dict[tuple[str, str], Graph] = {}  # templates this process traced, for its later ranks
        store = CaptureCache(
            capture.check,
            capture.project,
            world_size,
            meta_inputs,
            capture.read_source,
            capture.environment_at_start,
        )
        known = _stored_ranks(store, world_size)
        for pieces in known.values():
            _remember(pieces, traced)
        if capture.rank_reference is _NOT_BUILT and len(known) < world_size and not same_code:
            # the reference every rank's builder receives, built once (None: each rank builds its own)
            with library_shims():
                capture.rank_reference = build_reference_for_ranks(capture.build_reference)
        shared = capture.rank_reference if capture.rank_reference is not _NOT_BUILT else None
        # a fork per rank costs ~0.07 s (a process of torch's size): worth it for a large model only
        isolate = shared is not None and shared.seconds >= _WORTH_A_FORK

        def capture_rank(rank: int) -> ProgramPieces:
            with fake_rank(rank, world_size):
                # in a fork of its own, a rank may change the shared reference: no other rank sees it
                prebuilt = shared if in_own_fork() else None
                # (the same code's ranks relate to the one-rank reference by name and shape)
                same_code_values = capture.memoized_reference[0].values if same_code else None
                built = capture.build_rank(rank, world_size, same_code_values, prebuilt)
                parallel, values = built.module, built.values
                if dtensor.uses_dtensor(parallel):
                    raise NotMemoizable("DTensor programs are decomposed differently (see dtensor.py)")
                pieces = _pieces(parallel, values, meta_inputs, f"rank{rank}", rank, world_size, group_ranks, traced)
            memoizable = {i.path for i in pieces.instances if i.memoizable}
            forms = _Forms(pieces.values, memoizable)
            pieces.forms = {path: forms(path) for path in memoizable}
            if store.enabled:  # what a stored capture is checked against
                graphs = [pieces.skeleton, *pieces.templates.values()]
                pieces.read_files = project_files(capture.project) | source_files(graphs, [pieces.values])
            return pieces.without_modules()

        def check_first(pieces: ProgramPieces) -> None:
            # rank 0 shows what rules out memoization for every rank (blocks entered
            # sequence-sharded): known before the other ranks are captured
            reference = capture.memoized_reference[0]
            _units(reference, [pieces], _groups(reference, [pieces]))

        ranks = map_ranks(
            capture_rank,
            world_size,
            check_first=check_first,
            announce=lambda rank: capture.progress(f"capturing rank {rank} of {world_size}, each distinct layer once"),
            before_own=trace_reference,
            isolate=isolate,
            learn=lambda pieces: _remember(pieces, traced),
            known=known,
        )
        for rank, pieces in enumerate(ranks):
            if rank not in known:
                store.store(f"rank{rank}", pieces, pieces.read_files)
    reference = capture.memoized_reference[0]
    groups = _groups(reference, ranks)
    units = _units(reference, ranks, groups)
    reference = _regrouped(reference, groups)
    ranks = [_regrouped(program, groups) for program in ranks]
    for program in [reference, *ranks]:
        for graph in [program.skeleton, *program.templates.values()]:
            capture.other_sources.update(graph.source_files)
    return MemoizedCapture(reference, ranks, units, len(known))


def _stored_ranks(store: CaptureCache, world_size: int) -> dict[int, ProgramPieces]:
    """The ranks whose stored captures still hold (capture_cache.py), by rank."""
    known = {}
    if store.enabled:
        for rank in range(world_size):
            pieces = store.lookup(f"rank{rank}")
            if isinstance(pieces, ProgramPieces):
                known[rank] = pieces
    return known


def _pieces(
    module: nn.Module,
    values: dict[str, Expr],
    meta_inputs: tuple[Any, ...],
    name: str,
    rank: int | None,
    world_size: int,
    resolve: Any,
    traced: dict[tuple[str, str], Graph] | None = None,
) -> ProgramPieces:
    """One program cut at its blocks. `traced`: template graphs of other ranks of this world size,
    by instance path and record (see `_same_template`), reused where they stand for this rank's."""
    recorded = _recorded(module, meta_inputs)
    return _traced(module, values, recorded, meta_inputs, name, rank, world_size, resolve, traced)


def _recorded(module: nn.Module, meta_inputs: tuple[Any, ...]) -> blocks.ProgramRecord:
    """The program's block instances, recorded; NotMemoizable when no block repeats."""
    try:
        try:
            recorded = blocks.record_program(module, meta_inputs)
        except Exception as exc:  # retried below, as `export_module` retries its trace
            if not mixes_cpu_into_meta(exc):
                raise
            # a factory call without a device (`torch.arange(n)` in forward) makes its tensor on
            # the meta device, as the export of the same forward does (exporting.py)
            with torch.device("meta"):
                recorded = blocks.record_program(module, meta_inputs)
    except Exception as exc:  # noqa: BLE001 - the plain capture reports user errors at their line
        raise NotMemoizable(f"the eager run on meta tensors failed ({type(exc).__name__})") from None
    memoized = [i for i in recorded.instances if i.memoizable and not i.lone]
    if not memoized or len({i.template for i in memoized}) == len(memoized):
        raise NotMemoizable("no block repeats")
    return recorded


def _traced(
    module: nn.Module,
    values: dict[str, Expr],
    recorded: blocks.ProgramRecord,
    meta_inputs: tuple[Any, ...],
    name: str,
    rank: int | None,
    world_size: int,
    resolve: Any,
    traced: dict[tuple[str, str], Graph] | None = None,
) -> ProgramPieces:
    """The skeleton (every memoizable instance an opaque call) and each template's graph. A
    skeleton another rank of this process traced with an equal record is reused (`_same_template`:
    equal records are the same operations, the same block calls and the same tensors held)."""
    instances = recorded.instances
    memoized = [i for i in instances if i.memoizable]
    stage = "tracing the reference" if rank is None else f"tracing rank {rank} of {world_size}"
    skeleton_key = (_SKELETON, recorded.skeleton or "")
    known_skeleton = (traced or {}).get(skeleton_key) if recorded.skeleton is not None else None
    if known_skeleton is not None:
        glue = _same_template(known_skeleton, name, rank)
    else:
        with blocks.opaque_blocks(module, memoized):
            glue = to_graph(export_module(module, meta_inputs, stage + " (skeleton)"), name, rank, world_size, resolve)
        if traced is not None and recorded.skeleton is not None and not _names_own_rank(glue):
            traced[skeleton_key] = glue
    lone: dict[str, tuple[str, Graph]] = {}
    for instance in memoized:
        if instance.lone:
            known = (traced or {}).get((instance.path, instance.digest))
            graph = known or to_graph(_export_block(instance, stage), name, rank, world_size, resolve)
            if known is None and traced is not None and not _names_own_rank(graph):
                traced[(instance.path, instance.digest)] = graph
            lone[instance.path] = (instance.digest, graph)
    try:
        skeleton = inline_calls(glue, {f"{path}|{path}": graph for path, (_, graph) in lone.items()})
    except NotInlined:
        # the skeleton traced whole, as a program without lone modules is (shared by no rank)
        blocks_only = [i for i in memoized if not i.lone]
        with blocks.opaque_blocks(module, blocks_only):
            skeleton = to_graph(
                export_module(module, meta_inputs, stage + " (skeleton)"), name, rank, world_size, resolve
            )
        glue, lone = None, {}
    templates: dict[str, Graph] = {}
    for instance in memoized:
        if instance.lone or instance.template != instance.path or instance.path in templates:
            continue
        known = (traced or {}).get((instance.path, instance.digest))
        if known is not None:
            templates[instance.path] = _same_template(known, name, rank)
            continue
        graph = to_graph(_export_block(instance, stage), name, rank, world_size, resolve)
        templates[instance.path] = graph
        if traced is not None and not _names_own_rank(graph):
            traced[(instance.path, instance.digest)] = graph
    blocks_alone = [i for i in instances if not i.lone]
    return ProgramPieces(skeleton, values, blocks_alone, templates, recorded.skeleton, glue=glue, lone=lone)


def _remember(pieces: ProgramPieces, traced: dict[tuple[str, str], Graph]) -> None:
    """Keep the graphs a rank traced in a fork of its own for the ranks forked after it, as if it
    had been captured in this process (see `_traced`)."""
    for instance in pieces.instances:
        graph = pieces.templates.get(instance.path)
        own_template = instance.memoizable and instance.template == instance.path
        if own_template and graph is not None and not _names_own_rank(graph):
            traced.setdefault((instance.path, instance.digest), graph)
    for path, (digest, graph) in pieces.lone.items():
        if not _names_own_rank(graph):
            traced.setdefault((path, digest), graph)
    if pieces.skeleton_record is not None and pieces.glue is not None and not _names_own_rank(pieces.glue):
        traced.setdefault((_SKELETON, pieces.skeleton_record), pieces.glue)


_WORTH_A_FORK = 0.15  # seconds of building the reference that make a fork per rank pay
_SKELETON = "<skeleton>"  # the key of a skeleton among the traced graphs (no block path is empty-bracketed)


def _names_own_rank(graph: Graph) -> bool:
    """A graph that says more of its rank than its record: the peer of a point-to-point call."""
    return any(n.collective is not None and n.collective.kind == "p2p" for n in graph.nodes)


_WARM = False


def warm_up_tracing() -> None:
    """Import what a process's first trace imports (about 2 s of torch's modules: sympy, the
    export machinery), before the ranks' processes fork, so that each of them does not. The
    first trace also sets `TORCHINDUCTOR_CACHE_DIR`: a long-lived process warms up before its
    first run, so that every run starts from the same environment (stored captures are checked
    against it, capture_cache.py)."""
    global _WARM
    if _WARM:
        return
    with torch.device("meta"):
        probe = nn.Linear(2, 2)
    export_module(probe, (torch.empty(1, 2, device="meta"),), "warming up the tracer")
    _WARM = True


def _same_template(graph: Graph, name: str, rank: int | None) -> Graph:
    """Another rank's graph of a block instance at the same path with an equal record, as this
    rank's: equal records are the same operations on the same literals, with collectives over the
    same groups (blocks.py), which is what a template stands for within one program too. What a
    graph says of its own rank beyond its record (the peer of a point-to-point call) rules the
    graph out of being shared. The nodes are shared too: no stage changes a captured graph's
    nodes in place (each makes new ones), and copying them took ~10 ms per graph."""
    lists = {"nodes": list(graph.nodes), "placeholders": list(graph.placeholders), "outputs": list(graph.outputs)}
    return replace(graph, name=name, rank=rank, **lists)


def _export_block(instance: blocks.BlockInstance, stage: str) -> torch.export.ExportedProgram:
    """The instance traced on its own, with every tensor it received (positional or keyword, in the
    order `blocks.call_tensors` lists them: the inputs of its opaque call in the skeleton) as a
    positional input, and every other argument as it was."""
    leaves, spec = pytree.tree_flatten((instance.args, instance.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    class Call(nn.Module):
        """The block with the arguments it was called with, its tensors given positionally."""

        def __init__(self) -> None:
            super().__init__()
            self.block = instance.module

        def forward(self, *tensors: torch.Tensor) -> Any:
            given = list(leaves)
            for position, tensor in zip(positions, tensors, strict=True):
                given[position] = tensor
            args, kwargs = pytree.tree_unflatten(given, spec)
            return self.block(*args, **kwargs)

    kind = "module" if instance.lone else "block"
    tensors = tuple(leaves[i] for i in positions)
    return export_module(Call(), tensors, f"{stage} ({kind} {instance.path})")


def _within(values: dict[str, Expr], path: str) -> dict[str, Expr]:
    """The values of one block instance, named inside it ("attention.wq.weight"), with the
    wrapper's prefix (`block.`) that `_export_block` adds."""
    prefix = path + "."
    return {"block." + name[len(prefix) :]: expr for name, expr in values.items() if name.startswith(prefix)}


class _Forms:
    """The relations of each instance's parameters with its own path written `#`: equal forms mean
    the instance relates to the reference's the way its template does. Computed once per program
    for the instances asked about (values grouped by instance path in one pass over them)."""

    def __init__(self, values: dict[str, Expr], paths: set[str]) -> None:
        self._values = values
        self._paths = paths
        self._grouped: dict[str, list[tuple[str, Expr]]] | None = None
        self._forms: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        form = self._forms.get(path)
        if form is None:
            own = sorted(("block." + name[len(path) + 1 :], expr) for name, expr in self._group().get(path, []))
            prefix = re.compile(re.escape(path + "."))
            form = self._forms[path] = "\n".join(f"{name}={prefix.sub('#.', repr(expr))}" for name, expr in own)
        return form

    def _group(self) -> dict[str, list[tuple[str, Expr]]]:
        if self._grouped is None:
            grouped: dict[str, list[tuple[str, Expr]]] = {}
            for name, expr in self._values.items():
                # every instance path this name lies under (a block of a block: both)
                parts = name.split(".")
                for end in range(1, len(parts)):
                    path = ".".join(parts[:end])
                    if path in self._paths:
                        grouped.setdefault(path, []).append((name, expr))
            self._grouped = grouped
        return self._grouped


def _forms_of(program: ProgramPieces, paths: set[str]) -> Callable[[str], str]:
    """The parameter form of each instance path of `program`: those it was captured with, else
    computed here."""
    computed = _Forms(program.values, paths)
    known = program.forms or {}
    return lambda path: known[path] if path in known else computed(path)


def _groups(reference: ProgramPieces, ranks: list[ProgramPieces]) -> dict[str, str]:
    """Each memoizable instance of the reference -> the template that stands for it in every
    program: the first instance with the same template in each program (instances whose records
    are equal in every program are the same computation in every program). A rank may record one
    layer apart from the others where the reference records them alike (a layer that skips its
    all-reduce): that layer is then a template of its own everywhere, not a reason to trace every
    layer."""
    by_path = [{i.path: i for i in program.instances} for program in ranks]
    representative: dict[tuple[str, ...], str] = {}
    groups: dict[str, str] = {}
    for instance in reference.instances:
        if not instance.memoizable:
            continue
        key = [instance.template]
        for program, instances in zip(ranks, by_path, strict=True):
            own = instances.get(instance.path)
            if own is None or not own.memoizable:
                raise NotMemoizable(f"block {instance.path} is not memoizable on {program.skeleton.name}")
            key.append(own.template)
        groups[instance.path] = representative.setdefault(tuple(key), instance.path)
    return groups


def _template_graph(program: ProgramPieces, path: str) -> Graph:
    """The program's graph of the block at `path`: its own, or that of the instance with an equal
    record it was traced as (templates are traced inside a wrapper, so a graph names no path)."""
    graph = program.templates.get(path)
    if graph is not None:
        return graph
    own = next(i for i in program.instances if i.path == path)
    return program.templates[own.template]


def _units(reference: ProgramPieces, ranks: list[ProgramPieces], groups: dict[str, str]) -> list[TemplateUnit]:
    """Each template of `groups` (`_groups`) with its graph and values in every program."""
    units: dict[str, TemplateUnit] = {}
    paths = {i.path for i in reference.instances} | {i.template for i in reference.instances}
    reference_form = _Forms(reference.values, paths)
    rank_forms = [_forms_of(program, paths) for program in ranks]
    for instance in reference.instances:
        if not instance.memoizable:
            continue
        template = groups[instance.path]
        if reference_form(instance.path) != reference_form(template):
            # e.g. a buffer whose value differs per layer: the template's proof used its own
            raise NotMemoizable(f"the reference's {instance.path} differs from {template} in its values")
        for program, form in zip(ranks, rank_forms, strict=True):
            if form(instance.path) != form(template):
                raise NotMemoizable(f"the parameters of {instance.path} relate differently on {program.skeleton.name}")
        if template not in units:
            graphs = [_template_graph(p, template) for p in ranks]
            try:
                # the template proof assumes each rank's inputs relate to the reference's as their
                # shapes say (equal, or a block of one dim), and proves the same of its outputs
                terms = contracts(template, _template_graph(reference, template), graphs)
            except Unrelated as exc:
                raise NotMemoizable(f"block {template} receives inputs no assumed relation fits ({exc})") from None
            units[template] = TemplateUnit(
                template,
                _template_graph(reference, template),
                _within(reference.values, template),
                [(graph, _within(p.values, template)) for graph, p in zip(graphs, ranks, strict=True)],
                [],
                terms,
            )
        units[template].instances.append(instance.path)
    return list(units.values())


def _regrouped(program: ProgramPieces, groups: dict[str, str]) -> ProgramPieces:
    """The program with its skeleton's block calls keyed by the templates of `groups` (a call's
    key `template|path` is its literal argument: the reference's and a rank's calls of one
    instance must name the same template)."""
    nodes = []
    for node in program.skeleton.nodes:
        if template_of(node) is not None:
            _, path = blocks.parse_key(call_key(node))
            if path in groups:
                args = node.attrs["args"]
                node = replace(node, attrs={**node.attrs, "args": [*args[:-1], f"{groups[path]}|{path}"]})
        nodes.append(node)
    return replace(program, skeleton=replace(program.skeleton, nodes=nodes))
