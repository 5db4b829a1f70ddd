"""shardproof's graph IR: torch-free, serialisable, one per captured program.

Invariants (what capture guarantees and every later stage relies on):
- `Graph.nodes` is in topological order; every id in `Node.inputs` names an earlier node or a
  placeholder of the same graph.
- every tensor value has a `TensorMeta`; dims stored in `Node.attrs` are negative (counted from
  the last dimension), so broadcasting operands line up without renumbering.
- collectives carry the ranks of their group, never a process-group name.
- `Node.site` holds the user frames (outermost first) of the call that created the node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Frame:
    """One user stack frame with the exact source range of the executing expression."""

    file: str
    line: int
    function: str
    code: str = ""
    column: int | None = None  # 0-based, code points
    end_line: int | None = None
    end_column: int | None = None  # exclusive
    library: str | None = None  # the installed package of this frame (fairscale, megatron, ...), None for user code

    def location(self) -> str:
        col = f":{self.column + 1}" if self.column is not None else ""
        return f"{self.file}:{self.line}{col}"


@dataclass(frozen=True, slots=True)
class SourceSite:
    """The user frames of a call, outermost first; the last frame is where the op ran."""

    frames: tuple[Frame, ...]

    @property
    def innermost(self) -> Frame | None:
        """Where the op ran in the user's code: the innermost frame outside installed libraries
        (the user's call into fairscale, not fairscale's all_reduce line), else the innermost."""
        for frame in reversed(self.frames):
            if frame.library is None:
                return frame
        return self.frames[-1] if self.frames else None

    def library_frame_inside(self, frame: Frame) -> Frame | None:
        """The innermost library frame called from `frame`, if the op ran inside a library."""
        if frame not in self.frames:
            return None
        inner = self.frames[self.frames.index(frame) + 1 :]
        libraries = [f for f in inner if f.library is not None]
        return libraries[-1] if libraries else None

    def to_dict(self) -> dict[str, Any]:
        return {"frames": [asdict(f) for f in self.frames]}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SourceSite:
        return SourceSite(tuple(Frame(**f) for f in data["frames"]))


@dataclass(frozen=True, slots=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class Collective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | p2p
    reduce_op: str | None  # sum | max | min | avg | None
    group: tuple[int, ...]  # global ranks, in group order
    dim: int = 0  # gather / scatter dimension (functional collectives use dim 0)
    src: int | None = None  # broadcast or p2p source (the sending rank), a global rank
    output_splits: tuple[int, ...] | None = None
    input_splits: tuple[int, ...] | None = None


@dataclass(slots=True)
class Node:
    id: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, Any]
    meta: TensorMeta
    site: SourceSite | None = None
    module_path: str = ""
    module_type: str = ""
    collective: Collective | None = None
    original: str = ""  # the aten op the node was normalised from


PLACEHOLDER_KINDS = ("parameter", "buffer", "input", "constant")


@dataclass(frozen=True, slots=True)
class GradientRole:
    """An output that is a parameter gradient: of reference parameter `parameter`, or (on a rank)
    of `rank_parameter`, equal to the whole reference gradient or to its block [start, end) of
    `dim` (dim None: the whole)."""

    parameter: str
    rank_parameter: str | None = None
    dim: int | None = None
    start: int = 0
    end: int = 0
    absent: bool = False  # the rank computes no gradient for its parameter (zeros stand in)
    # (dim, offset, length) of the rank parameter's gradient that shows it (None: all of it)
    rank_block: tuple[int, int, int] | None = None


@dataclass(frozen=True, slots=True)
class Placeholder:
    id: str
    kind: str  # one of PLACEHOLDER_KINDS
    target: str  # parameter / buffer FQN, input path ("0", "0.tokens"), constant name
    meta: TensorMeta
    # a constant whose value the capture knows (a tensor the forward made from literals, lifted by
    # export): its value's digest (capture/folding.py), the same for equal values in any program
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class ModulePlacement:
    """A reference module a rank's module tree holds (the same object): at `path` on the rank,
    `reference` in the reference, attached where `site` assigned it (or the container holding it)."""

    path: str
    reference: str
    site: SourceSite | None = None


@dataclass(frozen=True, slots=True)
class PlanLayouts:
    """What a plan entry says of its module's activations, each layout written as DTensor's
    placement is (`Replicate()`, `Partial()`, `Shard(-1)`), None for an argument it leaves alone.
    `input_claims` are the layouts it says the positional inputs have (DTensor takes them on
    trust: `from_local`); `output_claims` the same for the outputs the forward returns
    (PrepareModuleOutput's `output_layouts`; empty when DTensor computes them, as for a
    ColwiseParallel linear); `outputs` the layouts the outputs leave the module with."""

    input_claims: tuple[str | None, ...] = ()
    output_claims: tuple[str | None, ...] = ()
    outputs: tuple[str | None, ...] = ()


@dataclass(slots=True)
class Graph:
    """A captured program: the reference (rank None) or one rank of the parallel version."""

    name: str  # "reference" or "rank0", "rank1", ...
    rank: int | None
    world_size: int
    placeholders: list[Placeholder]
    nodes: list[Node]
    outputs: list[str]
    source_files: set[str] = field(default_factory=set)
    # module path -> the plan entry that parallelized it (DTensor plans), `function` = the style
    plan_entries: dict[str, Frame] = field(default_factory=dict)
    # module path -> the layouts its plan entry declares (absent when the style declares none known)
    plan_layouts: dict[str, PlanLayouts] = field(default_factory=dict)
    # per output, when gradients are verified: None for a forward output, else which gradient it is
    gradient_roles: list[GradientRole | None] = field(default_factory=list)
    # reference gradients this rank cannot show (no parameter holds them whole or as one block)
    gradient_gaps: list[str] = field(default_factory=list)
    # where user code detaches a value in the forward (a place gradients stop)
    gradient_cuts: list[SourceSite] = field(default_factory=list)
    # the reference modules the rank's module holds, outermost only (pipeline stages, layer splits)
    placements: list[ModulePlacement] = field(default_factory=list)
    # value id -> the value (a CPU tensor) of a small constant computed while capturing that an
    # operation on other values reads (capture/folding.py): what verify/constant_blocks.py compares
    constants: dict[str, Any] = field(default_factory=dict)
    # where a dropout with p > 0 in training mode was taken as the identity (the forward is verified
    # as in eval mode; a random mask is no function of the inputs)
    identity_dropouts: list[SourceSite] = field(default_factory=list)
    # value id -> a value of this graph holding the same elements (capture/leading_dims.py): equal
    # to it when their shapes agree, else the value is its view
    view_twins: dict[str, str] = field(default_factory=dict)

    def node_map(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    def meta_of(self, value_id: str) -> TensorMeta:
        for p in self.placeholders:
            if p.id == value_id:
                return p.meta
        for n in self.nodes:
            if n.id == value_id:
                return n.meta
        raise KeyError(value_id)

    def consumers(self) -> dict[str, list[str]]:
        users: dict[str, list[str]] = {}
        for n in self.nodes:
            for i in n.inputs:
                users.setdefault(i, []).append(n.id)
        return users
