"""Capture a check: the reference graph, and per rank its graph and parameter provenance.

Everything runs on meta tensors in this one process: the reference is built under
`torch.device("meta")`, every rank of the parallel version is built and traced under the fake
process group, and non-strict `torch.export` + functionalisation give graphs with collectives as
nodes. The reference is rebuilt for every rank because `parallel` may shard it in place.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import Check, Project
from ..errors import ConfigError, UserCodeError, user_code_error
from ..graph.model import Graph, ModulePlacement
from ..graph.numbers import BuilderNumbers
from ..relations.expr import Expr, ParamRef, is_deterministic
from . import collector, dtensor, environment, example_values
from .blocks import tensor_attributes
from .exporting import export_module, joint_graph, quiet_torch_logs, trace_with_gradients
from .fake_pg import fake_rank, group_ranks
from .forked import map_ranks
from .lowering_tables import dtype_name
from .normalize import to_graph
from .numbers import plain_attributes, tracing_numbers
from .placement import placements, recording_attachments
from .project_code import (
    forget_project_modules,
    import_roots,
    load_callable,
    project_files,
    read_from_disk,
    source_files,
)
from .provenance import ProvenanceTracker
from .same_code import declared_relation, same_code_relation

ProgressFn = Callable[[str], None]


@dataclass
class RankCapture:
    rank: int
    graph: Graph
    values: dict[str, Expr]  # placeholder target (parameter / buffer FQN) -> provenance over the reference
    numbers: BuilderNumbers = field(default_factory=BuilderNumbers)  # how its builder computed shard numbers


@dataclass
class ReferenceCapture:
    graph: Graph
    values: dict[str, Expr]  # placeholder target -> ParamRef, or a Constant for recomputable buffers
    inputs: tuple[Any, ...]  # the real example inputs (for numeric checks)
    seconds: float
    program: torch.export.ExportedProgram | None = None  # kept to decompose it like DTensor ranks
    decomposed_like_dtensor: bool = False


@dataclass
class CaptureResult:
    reference: ReferenceCapture
    ranks: list[RankCapture]
    world_size: int
    seconds: dict[str, float] = field(default_factory=dict)


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("meta")
    if isinstance(value, list | tuple):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


def _call_user(fn: Callable[..., Any], stage: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except (ConfigError, UserCodeError):
        raise
    except Exception as exc:  # noqa: BLE001 - any error in user code is reported at its line
        raise user_code_error(exc, stage) from None


# What torch says when code ignores the meta device: fairscale allocates its shards with the
# legacy `torch.Tensor(rows, cols)` constructor (always CPU) and copies meta values into them.
_IGNORES_META = "from device meta to device cpu"


def _build_module(build: Callable[..., Any], stage: str, tracker: ProvenanceTracker, *args: Any) -> Any:
    """Run a builder on the meta device (nothing is allocated). A builder that ignores the meta
    device runs again under FakeTensorMode. Tensors it made off the meta device either way
    (fairscale's legacy `torch.Tensor(rows, cols)` is always CPU) are moved to meta."""
    try:
        with tracker, torch.device("meta"):
            module = build(*args)
    except (ConfigError, UserCodeError):
        raise
    except Exception as exc:  # noqa: BLE001 - any error in user code is reported at its line
        if _IGNORES_META not in str(exc):
            raise user_code_error(exc, stage) from None
        module = _build_faked(build, stage, tracker, *args)
    if isinstance(module, nn.Module):
        _move_to_meta(module, tracker)
    return module


def _build_faked(build: Callable[..., Any], stage: str, tracker: ProvenanceTracker, *args: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True), tracker:
        return _call_user(build, stage, *args)


def _move_to_meta(module: nn.Module, tracker: ProvenanceTracker) -> None:
    """Replace every tensor of a module that is not on the meta device (a fake or a CPU tensor)
    by a meta tensor, keeping sharing and what the tracker knows of it."""
    from torch._subclasses.fake_tensor import FakeTensor

    moved: dict[int, torch.Tensor] = {}

    def meta_of(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in moved:
            replacement = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
            if isinstance(tensor, nn.Parameter):
                replacement = nn.Parameter(replacement, requires_grad=tensor.requires_grad)
            tracker.register(replacement, tracker.expr_of(tensor))
            moved[id(tensor)] = replacement
        return moved[id(tensor)]

    def off_meta(value: object) -> bool:
        return isinstance(value, torch.Tensor) and (value.device.type != "meta" or isinstance(value, FakeTensor))

    for submodule in module.modules():
        for name, param in list(submodule._parameters.items()):
            if off_meta(param):
                submodule._parameters[name] = meta_of(param)  # type: ignore[arg-type,assignment]
        for name, buffer in list(submodule._buffers.items()):
            if off_meta(buffer):
                submodule._buffers[name] = meta_of(buffer)  # type: ignore[arg-type]
        for name, value in list(vars(submodule).items()):
            if not name.startswith("_") and off_meta(value):
                setattr(submodule, name, meta_of(value))  # type: ignore[arg-type]


def _build_reference(build: Callable[[], Any], tracker: ProvenanceTracker) -> tuple[nn.Module, dict[str, Expr]]:
    module = _build_module(build, "building the reference", tracker)
    if not isinstance(module, nn.Module):
        raise UserCodeError(f"the reference builder returned {type(module).__name__}, not an nn.Module")
    module.eval()
    values: dict[str, Expr] = {}
    persistent = {name for name, _ in module.state_dict(keep_vars=True).items()}
    for name, param in module.named_parameters(remove_duplicate=False):
        expr = ParamRef(name=name, shape=tuple(param.shape), dtype=dtype_name(param.dtype))
        tracker.register(param, expr)
        values[name] = expr
    for name, buffer in list(module.named_buffers(remove_duplicate=False)) + tensor_attributes(module):
        constructed = tracker.expr_of(buffer)
        if name in persistent or not is_deterministic(constructed):
            expr = ParamRef(name=name, shape=tuple(buffer.shape), dtype=dtype_name(buffer.dtype))
            tracker.register(buffer, expr)
        else:
            expr = constructed
        values[name] = expr
    return module, values


_NOT_BUILT = object()


@dataclass
class PrebuiltReference:
    """The reference as a rank's builder receives it, built once for every rank: the module, its
    parameters' values and the tracker that knows how its tensors were made."""

    module: nn.Module
    values: dict[str, Expr]
    tracker: ProvenanceTracker
    seconds: float  # how long the build took (what a rank saves by receiving it)


def build_reference_for_ranks(build: Callable[[], Any]) -> PrebuiltReference | None:
    """The reference built once, outside any process group, for every rank to receive; None when
    the build asks about the distributed world (its rank, its size, whether a process group
    exists, a library's parallel state: each rank must then build its own, in its own world).

    What a rank receives must be what its builder would have built in its own world: a builder
    that reads nothing of that world builds the same module in every world, and every question
    about it either raises here (no process group exists) or is `is_initialized`, which is
    watched. Errors are not reported from here: the rank's own build reports them."""
    import torch.distributed as dist

    asked: list[str] = []
    watched = {"is_initialized": dist.is_initialized}  # (`is_available` is a fact of the build of torch)

    def watching(name: str, original: Callable[[], bool]) -> Callable[[], bool]:
        def watched_call() -> bool:
            asked.append(name)
            return original()

        return watched_call

    if dist.is_initialized():
        return None
    modules = [dist, dist.distributed_c10d]
    saved = [(m, name, getattr(m, name)) for m in modules for name in watched if hasattr(m, name)]
    try:
        for module, name, original in saved:
            setattr(module, name, watching(name, original))
        tracker = ProvenanceTracker()
        start = time.perf_counter()
        try:
            module_built, values = _build_reference(build, tracker)
        except Exception:  # noqa: BLE001 - each rank builds its own and reports what fails there
            return None
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    if asked:
        return None
    return PrebuiltReference(module_built, values, tracker, time.perf_counter() - start)


@dataclass
class BuiltRank:
    """One rank's module as its builder made it, and what capture learned while it ran."""

    module: nn.Module
    values: dict[str, Expr]  # parameters' and buffers' relations to the reference
    applied_styles: list[dtensor.AppliedStyle]  # DTensor plan styles applied while building
    placements: list[ModulePlacement]  # the reference modules it holds (not for same-code checks)
    numbers: BuilderNumbers = field(default_factory=BuilderNumbers)  # how it computed shard numbers


class CheckCapture:
    """Captures one check; the reference graph is captured once and reused for every world size."""

    def __init__(self, check: Check, project: Project, progress: ProgressFn | None = None) -> None:
        self.check = check
        self.project = project
        self.progress = progress or (lambda _msg: None)
        self._reference: ReferenceCapture | None = None
        self.reference_error: dict[str, Any] | None = None  # why the reference could not be captured
        self.other_sources: set[str] = set()  # files of graphs captured outside `captured` (memoized)
        self.memoized_reference: Any = None  # the reference cut at its blocks (capture/memoized.py)
        self.rank_reference: Any = _NOT_BUILT  # the reference each rank receives, built once (memoized.py)
        self.captured: list[CaptureResult] = []  # every world size captured so far (for dependencies)
        # how the project's files read now (the editor's unsaved buffers, else the disk), and the
        # environment the run started with: what stored captures are checked against
        self.read_source: Callable[[str], str | None] = read_from_disk
        self.environment_at_start = environment.snapshot()
        with import_roots(project.python_path):
            forget_project_modules(project)
            self.build_reference = load_callable(check.reference, "reference", check, project)
            self.make_inputs = load_callable(check.inputs, "inputs", check, project)
            # The project files the reference and its inputs import: a reference capture can be
            # reused while these files are unchanged (the editor re-verifies after every edit).
            self.reference_files = project_files(project)
            self.build_parallel = load_callable(check.parallel, "parallel", check, project)

    def adopt_reference(self, reference: ReferenceCapture) -> None:
        """Reuse a reference captured from identical reference files."""
        self._reference = reference

    def cached_reference(self) -> ReferenceCapture | None:
        return self._reference

    def dependencies(self, captured: list[CaptureResult]) -> set[str]:
        """Files that take part in the check: imported project files and every captured site."""
        graphs = [self._reference.graph] if self._reference else []
        ranks = [rank for result in captured for rank in result.ranks]
        graphs.extend(rank.graph for rank in ranks)
        files = project_files(self.project) | source_files(graphs, [rank.values for rank in ranks])
        return files | {f for f in self.other_sources if not f.startswith("<")}

    def example_inputs(self) -> tuple[Any, ...]:
        """The user's example inputs, as a tuple (call inside `import_roots`)."""
        inputs = _call_user(self.make_inputs, "making the example inputs")
        if not isinstance(inputs, tuple):
            inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
        example_values.remember(inputs)
        return inputs

    @collector.paused()
    def reference(self) -> ReferenceCapture:
        if self._reference is None:
            start = time.perf_counter()
            self.progress("capturing the reference")
            with import_roots(self.project.python_path):
                inputs = self.example_inputs()
                tracker = ProvenanceTracker()
                if self.check.same_code_reference:
                    # The parallel code itself under a one-rank process group: its collectives
                    # are over one rank, the identity.
                    with fake_rank(0, 1):
                        module, values = _build_reference(self.build_reference, tracker)
                        graph, program = self._trace_reference(
                            module, _to_meta(inputs), "tracing the reference (world size 1)", group_ranks
                        )
                else:
                    module, values = _build_reference(self.build_reference, tracker)
                    graph, program = self._trace_reference(module, _to_meta(inputs), "tracing the reference")
            self._reference = ReferenceCapture(graph, values, inputs, time.perf_counter() - start, program)
        return self._reference

    def _decompose_reference_like_dtensor(self, reference: ReferenceCapture) -> None:
        """DTensor ranks are decomposed further than the reference (see dtensor.py); the reference
        gets the same decompositions once, so both sides build their masks and norms from the
        same operations (an attention mask made with `diff` on one side, slices on the other,
        would not be recognisably the same value)."""
        if reference.decomposed_like_dtensor or reference.program is None or self.check.same_code_reference:
            return  # (a same-code reference has the DTensors itself)
        with warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            program = reference.program.run_decompositions(dtensor.decomposition_table())
        reference.graph = to_graph(program, "reference", None, 1)
        reference.decomposed_like_dtensor = True

    @collector.paused()
    def capture(self, world_size: int) -> CaptureResult:
        reference = self.reference()
        meta_inputs = _to_meta(reference.inputs)
        start = time.perf_counter()

        def capture_rank(rank: int) -> tuple[RankCapture, bool]:
            with fake_rank(rank, world_size):
                built = self.build_rank(rank, world_size, reference.values)
                module, values = built.module, built.values
                plan = dtensor.plan_entries(module, built.applied_styles)
                if self.check.gradients is not None:
                    graph = self._rank_joint_graph(module, values, meta_inputs, reference.graph, rank, world_size)
                else:
                    program = export_module(module, meta_inputs, f"tracing rank {rank} of {world_size}", plan)
                    graph = to_graph(program, f"rank{rank}", rank, world_size, group_ranks)
                graph.plan_entries = plan
                graph.plan_layouts = dtensor.plan_layouts(module, built.applied_styles)
                graph.placements = built.placements
            return RankCapture(rank, graph, values, built.numbers), dtensor.uses_dtensor(module)

        with import_roots(self.project.python_path):
            captured = map_ranks(
                capture_rank, world_size, announce=lambda rank: self.progress(f"capturing rank {rank} of {world_size}")
            )
        if any(uses_dtensor for _, uses_dtensor in captured):
            self._decompose_reference_like_dtensor(reference)
        ranks = [rank for rank, _ in captured]
        elapsed = time.perf_counter() - start
        return CaptureResult(reference, ranks, world_size, {"reference": reference.seconds, "ranks": elapsed})

    def _trace_reference(
        self, module: nn.Module, inputs: tuple[Any, ...], stage: str, resolve: Any = None
    ) -> tuple[Graph, torch.export.ExportedProgram | None]:
        """The reference's graph, and its exported program (None for a joint forward-backward graph)."""
        if self.check.gradients is not None:
            joint = trace_with_gradients(module, inputs, self._step("reference_step"), f"{stage} (with gradients)")
            return joint_graph(joint, "reference", None, 1, resolve), None
        program = export_module(module, inputs, stage)
        return to_graph(program, "reference", None, 1, resolve), program

    def _step(self, which: str) -> Callable[..., Any] | None:
        """The declared reference or parallel step of a gradients check (None: the default)."""
        gradients = self.check.gradients
        spec = getattr(gradients, which) if gradients is not None else None
        if spec is None:
            return None
        return load_callable(spec, which.replace("_", "-"), self.check, self.project)

    def _rank_joint_graph(
        self,
        module: nn.Module,
        values: dict[str, Expr],
        inputs: tuple[Any, ...],
        reference: Graph,
        rank: int,
        world_size: int,
    ) -> Graph:
        """A rank's joint graph, returning for every reference gradient the rank's counterpart."""
        from ..relations.expr import describe, referenced_params
        from .gradients import gradient_parts

        trainable = {name for name, p in module.named_parameters() if p.requires_grad}
        parts = gradient_parts(values, trainable)
        wanted = []
        gaps = []
        for role in reference.gradient_roles:
            if role is None:
                continue
            part = parts.get(role.parameter)
            wanted.append((role.parameter, part))
            if part is None:
                holders = [
                    f"`{n}` is {describe(e)}" for n, e in values.items() if role.parameter in referenced_params(e)
                ]
                gaps.append(
                    f"the gradient of `{role.parameter}` cannot be compared on rank {rank}: no rank parameter holds "
                    "that parameter whole or as one block" + (f" ({'; '.join(holders[:2])})" if holders else "")
                )
        step = self._step("parallel_step")
        joint = trace_with_gradients(
            module, inputs, step, f"tracing rank {rank} of {world_size} (with gradients)", wanted
        )
        graph = joint_graph(joint, f"rank{rank}", rank, world_size, group_ranks)
        graph.gradient_gaps = gaps
        return graph

    def build_rank(
        self,
        rank: int,
        world_size: int,
        same_code_values: dict[str, Expr] | None = None,
        prebuilt: PrebuiltReference | None = None,
    ) -> BuiltRank:
        """Build rank `rank` (inside its `fake_rank` context): the module in eval mode, its
        parameters' relations to the reference, the plan styles applied while building and the
        reference modules it holds. `same_code_values`: the one-rank reference's values, for the
        same-code pattern. `prebuilt`: the reference this rank's builder receives, already built
        (see `PrebuiltReference`); it is the rank's to change."""
        tracker = prebuilt.tracker if prebuilt is not None else ProvenanceTracker()
        stage = f"building rank {rank} of {world_size}"
        applied_styles: list[dtensor.AppliedStyle] = []
        held: list[ModulePlacement] = []
        numbers = BuilderNumbers()
        if self.check.same_code_reference:
            reference_values = same_code_values or {}
            module = _build_module(self.build_parallel, stage, tracker)
            distributed: dict[int, tuple[object, Expr]] = {}
        else:
            if prebuilt is not None:
                reference_module, reference_values = prebuilt.module, prebuilt.values
            else:
                reference_module, reference_values = _build_reference(self.build_reference, tracker)
            with (
                dtensor.recording_plan_entries() as applied_styles,
                dtensor.recording_distributed_sources(tracker.expr_of) as distributed,
                recording_attachments(reference_module) as attached,
                tracing_numbers(rank, world_size) as (traced_rank, traced_world, uses),
            ):
                module = _build_module(self.build_parallel, stage, tracker, reference_module, traced_rank, traced_world)
            numbers = BuilderNumbers(uses.uses)
            if isinstance(module, nn.Module):
                numbers.attributes = plain_attributes(module)
        if not isinstance(module, nn.Module):
            raise UserCodeError(
                f"the parallel builder returned {type(module).__name__} for rank {rank}, not an nn.Module"
            )
        module.eval()
        if not self.check.same_code_reference:
            held = placements(module, reference_module, attached)
        values = self._rank_values(module, tracker, reference_values, rank, world_size, distributed)
        return BuiltRank(module, values, applied_styles, held, numbers)

    def _rank_values(
        self,
        module: nn.Module,
        tracker: ProvenanceTracker,
        reference_values: dict[str, Expr],
        rank: int,
        world_size: int,
        distributed: dict[int, tuple[object, Expr]],
    ) -> dict[str, Expr]:
        values: dict[str, Expr] = {}
        buffers = list(module.named_buffers(remove_duplicate=False)) + tensor_attributes(module)
        buffer_names = {name for name, _ in buffers}
        for name, tensor in list(module.named_parameters(remove_duplicate=False)) + buffers:
            expr = tracker.expr_of(tensor)
            exported_name = name
            if dtensor.is_dtensor(tensor):
                # Placements say what the local tensor is; export names it apart.
                exported_name = dtensor.exported_name(name)
                source = distributed.get(dtensor.local_storage(tensor))
                if source is not None:  # the global tensor distribute_tensor made it from
                    expr = dtensor.local_relation(tensor, source[1]) or expr
                elif name in reference_values:
                    expr = dtensor.local_relation(tensor, reference_values[name]) or expr
            if self.check.same_code_reference and not (name in buffer_names and is_deterministic(expr)):
                # Parameters (and loaded buffers) of the same code at world size 1, by name and shape.
                expr = same_code_relation(expr, tuple(tensor.shape), reference_values.get(name), rank, world_size)
            override = self.check.relation_override(name)
            if override is not None:
                relation, reference_name, line = override
                reference = reference_values.get(reference_name)
                if reference is None:
                    raise ConfigError(
                        f"check {self.check.name!r}: the override for {name!r} names reference parameter "
                        f"{reference_name!r}, which does not exist (write `<relation> of <reference name>`)",
                        self.project.site(line),
                    )
                expr = declared_relation(expr, relation, reference, rank, world_size)
            values[exported_name] = expr
        return values
