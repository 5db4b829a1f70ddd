"""Relation laws of opaque operations, derived from DTensor's sharding strategies.

PyTorch's DTensor knows, for most aten ops (and any op with a registered strategy), which input
placements give which output placement without communication. A rank value that is `Shard(d)`,
`Replicate()` or `Partial(sum)` of the reference value is one of shardproof's relations, so each
such strategy answer is a law: "the op applied to the ranks' local values relates to the op
applied to the full values this way". For every opaque call of a program (an operation the
normalizer keeps whole and no hand-written rule matches: `index.Tensor`, `histc`, a library's
custom op), the strategies are asked for each single-placement combination of its inputs, on the
reference call's shapes; every communication-free answer becomes an egglog rule specialised to
that call (its target and literal arguments). Indexing along one dim, which DTensor has no
strategy for, adds candidates of its own (indexing_laws.py), checked the same way.

A strategy is PyTorch's claim, not a proof: each law is first checked on concrete tensors (the
op run on random full inputs and on the ranks' pieces of them, worlds of 2 and 3 ranks, even and
uneven pieces, an arbitrary range list where the law's rule accepts one). A law that fails its
check, or cannot be run, is excluded and listed (`LawSet.excluded`).

The rules keep what placements cannot say out of them: a `Shard` input or output is a selection
`(sel X x d R)` with the same range list on every sharded dim (of equal sizes, a side condition);
a contraction (`Shard` inputs, `Partial` output) needs one range `[s, e)` and states the partial
sum of that part of the reduction; a `Partial` input with every other input replicated (a linear
op) passes its partial-sum fact on. Laws mixing several partial inputs, or partial and sharded
ones, are not derived: the partial-sum algebra states those itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..graph.model import Graph, Node, TensorMeta

FAMILY = "derived"
MAX_COMBINATIONS = 256  # placement combinations asked per call (inputs of 4 dims or fewer)
# Ops that are the same function as an aten op with a DTensor strategy (a fact of the library's
# semantics, checked by the same concrete test: the library op itself is what the check runs).
EQUIVALENT_ATEN = {
    # transformers' loop over experts: the grouped matmul torch._grouped_mm computes
    "transformers::grouped_mm_fallback": "aten::_grouped_mm",
}
# Ops where a placement law is meaningless or never wanted: randomness, in-place scratch.
_SKIP_WORDS = ("rand", "dropout", "bernoulli", "empty", "uninitialized")
# Our own ops stand for a memoized block in a skeleton (capture/blocks.py): no computation to ask
# DTensor about, and one call per layer, each named by its instance (so no answer is shared).
_OWN_NAMESPACE = "shardproof::"


@dataclass(frozen=True)
class Placement:
    kind: str  # "R" replicated, "S" a block of dim `dim`, "P" a partial sum
    dim: int = 0  # negative

    def __str__(self) -> str:
        return {"R": "Replicate()", "P": "Partial(sum)"}.get(self.kind, f"Shard({self.dim})")


@dataclass(frozen=True)
class Law:
    target: str
    inputs: tuple[Placement, ...]
    output: Placement

    def __str__(self) -> str:
        return f"{self.target}({', '.join(map(str, self.inputs))}) -> {self.output}"

    def rule(self, key: str, attrs: str, ranks: tuple[int, ...]) -> str:
        """The egglog rule of this law for calls `(OpN key ... attrs)` (key and attrs quoted) whose
        operands and result have `ranks` dims."""
        n = len(self.inputs)
        full = [f"X{i}" for i in range(n)]
        local = [full[i] if p.kind == "R" else f"x{i}" for i, p in enumerate(self.inputs)]
        premises = [f"(= Y (Op{n} {key} {' '.join(full)} {attrs}))", f"(= y (Op{n} {key} {' '.join(local)} {attrs}))"]
        premises.extend(f"(= {nd} (nd {term}))" for term, nd in zip([*full, "Y"], ranks, strict=True))
        sharded = [i for i, p in enumerate(self.inputs) if p.kind == "S"]
        ranges = "(RCons s e (RNil))" if self.output.kind == "P" else "R"
        for i in sharded:
            premises.append(f"(sel X{i} x{i} {self.inputs[i].dim} {ranges})")
            premises.append(f"(= K (sz X{i} {self.inputs[i].dim}))")
        for i, p in enumerate(self.inputs):
            if p.kind == "P":
                premises.append(f"(psum X{i} x{i} s e K)")
        if self.output.kind == "S":
            premises.append(f"(= K (sz Y {self.output.dim}))")
            conclusion = f"(sel Y y {self.output.dim} R)"
        else:
            conclusion = "(psum Y y s e K)"
        name = json.dumps(self.name(key, attrs, ranks))
        return f"(rule ({' '.join(premises)}) ({conclusion}) :ruleset {FAMILY} :name {name})"

    def name(self, key: str, attrs: str, ranks: tuple[int, ...]) -> str:
        """Unique per call signature: calls of one target with other literal arguments or ranks
        get rules of their own."""
        digest = hashlib.sha256(f"{attrs}|{ranks}".encode()).hexdigest()[:8]
        return f"derived {json.loads(key)} [{digest}]: {', '.join(map(str, self.inputs))} -> {self.output}"


@dataclass
class LawSet:
    rules: list[str] = field(default_factory=list)
    laws: list[Law] = field(default_factory=list)
    excluded: list[tuple[Law, str]] = field(default_factory=list)  # the law and why its check failed

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(law.target for law in self.laws)


# ---------------------------------------------------------------------------------------------
# calls: an opaque node as a torch call again
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    op: Any  # torch OpOverload
    args: tuple[Any, ...]  # literal arguments, "<tensor>" where an input goes (lists nest)
    kwargs: tuple[str, ...]
    metas: tuple[TensorMeta, ...]  # the inputs', in order
    out: TensorMeta

    def run(self, tensors: list[Any]) -> Any:
        stream = iter(tensors)
        values = [_fill(a, stream) for a in self.args]
        n_pos = len(values) - len(self.kwargs)
        return self.op(*values[:n_pos], **dict(zip(self.kwargs, values[n_pos:], strict=True)))


def _fill(template: Any, tensors: Iterator[Any]) -> Any:
    if template == "<tensor>":
        return next(tensors)
    if isinstance(template, list):
        return [_fill(t, tensors) for t in template]
    return template


def resolve_op(target: str) -> Any | None:
    """`ns::name.overload` (or `ns::name` for the default overload) as a torch OpOverload."""
    import torch

    namespace, _, rest = target.partition("::")
    name, _, overload = rest.partition(".")
    if not namespace.isidentifier() or not name.isidentifier():
        return None  # not an operator (a memoized block's chain of calls)
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _typed_literal(value: Any, type_text: str) -> Any:
    """A literal argument back as the type the op's schema declares (dtypes were stored as names)."""
    import torch

    if value is None:
        return None
    if "ScalarType" in type_text and isinstance(value, str):
        return getattr(torch, value)
    if "Device" in type_text and isinstance(value, str):
        return torch.device(value)
    if "Layout" in type_text or "MemoryFormat" in type_text:
        raise ValueError("layout arguments are not replayed")
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def call_of(node: Node, metas: list[TensorMeta]) -> Call | None:
    """The torch call an opaque node records, or None when it cannot be replayed exactly."""
    target = str(node.attrs.get("target", ""))
    if node.attrs.get("index", 0) != 0 or any(word in target for word in _SKIP_WORDS):
        return None
    if target.startswith(_OWN_NAMESPACE):
        return None
    op = resolve_op(target)
    if op is None:
        return None
    args = list(node.attrs.get("args", []))
    kwargs = tuple(node.attrs.get("kwargs", []))
    if len(kwargs) > 1:
        return None  # recorded in call order, named in sorted order: the pairing is not known
    schema = {a.name: str(a.type) for a in op._schema.arguments}
    positional = [str(a.type) for a in op._schema.arguments if not a.kwarg_only]
    types = positional[: len(args) - len(kwargs)] + [schema.get(k, "") for k in kwargs]
    if len(types) != len(args):
        return None
    try:
        args = [
            a if (a == "<tensor>" or (isinstance(a, list) and "<tensor>" in a)) else _typed_literal(a, t)
            for a, t in zip(args, types, strict=True)
        ]
    except (ValueError, AttributeError):
        return None
    return Call(op, tuple(args), kwargs, tuple(metas), node.meta)


# ---------------------------------------------------------------------------------------------
# asking DTensor
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _mesh() -> Iterator[Any]:
    """A 2-rank device mesh on the fake process group (made here when none exists)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    made = not dist.is_initialized()
    if made:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        from ..capture.fake_pg import keep_excepthook

        with keep_excepthook():
            dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        # a world of one rank would shard nothing: placements are asked of two or more
        yield init_device_mesh("cpu", (dist.get_world_size(),)) if dist.get_world_size() > 1 else None
    finally:
        if made:
            dist.destroy_process_group()


def _placements(meta: TensorMeta) -> list[Placement]:
    options = [Placement("R")]
    options.extend(Placement("S", d - meta.ndim) for d in range(meta.ndim) if meta.shape[d] > 1)
    if _floating(meta.dtype):
        options.append(Placement("P"))
    return options


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, dtype)


def strategy_laws(call: Call) -> list[Law]:
    """Every communication-free strategy DTensor gives for single-placement combinations of the
    call's inputs, as laws (at most one partial input, never with a sharded one)."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    target = _target(call)
    ask_op = resolve_op(EQUIVALENT_ATEN.get(target, target)) or call.op
    options = [_placements(m) for m in call.metas]
    combos = list(itertools.islice(itertools.product(*options), MAX_COMBINATIONS))
    laws: list[Law] = []
    dispatcher = DTensor._op_dispatcher
    with _mesh() as mesh, _quiet():
        for combo in combos if mesh is not None else ():
            kinds = [p.kind for p in combo]
            if all(k == "R" for k in kinds) or kinds.count("P") > 1 or ("P" in kinds and "S" in kinds):
                continue
            tensors = []
            for placement, meta in zip(combo, call.metas, strict=True):
                dtype = _torch_dtype(meta.dtype)
                if ask_op is not call.op and _floating(meta.dtype):
                    dtype = torch.bfloat16  # the aten kernel's meta function wants bf16; placements ignore it
                local = torch.empty(meta.shape, dtype=dtype, device="meta")
                if placement.kind == "S":
                    dt_placement = Shard(placement.dim + meta.ndim)
                else:
                    dt_placement = Replicate() if placement.kind == "R" else Partial()
                tensors.append(
                    DTensor.from_local(
                        local, mesh, (dt_placement,), run_check=False, shape=local.shape, stride=local.stride()
                    )
                )
            try:
                info = dispatcher.unwrap_to_op_info(ask_op, *_args_kwargs(call, tensors))
                sharding = dispatcher.sharding_propagator.propagate_op_sharding(info.schema)
            except Exception:  # noqa: BLE001 - no strategy for these placements
                continue
            spec = sharding.output_spec
            if sharding.needs_redistribute or spec is None or not hasattr(spec, "placements"):
                continue
            (placement,) = spec.placements
            if placement.is_replicate():
                continue
            if placement.is_partial():
                if getattr(placement, "reduce_op", "sum") != "sum":
                    continue
                output = Placement("P")
            else:
                output = Placement("S", placement.dim - call.out.ndim)
            law = Law(target, tuple(combo), output)
            if _one_size(law, call):
                laws.append(law)
    return laws


def _one_size(law: Law, call: Call) -> bool:
    """Whether every sharded dim of the law (inputs and output) has one size: the rule selects
    the same ranges of each (DTensor's Shard means the rank's block of each, whatever its size)."""
    sizes = {m.shape[p.dim] for p, m in zip(law.inputs, call.metas, strict=True) if p.kind == "S"}
    if law.output.kind == "S":
        sizes.add(call.out.shape[law.output.dim])
    return len(sizes) <= 1


def _args_kwargs(call: Call, tensors: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    stream = iter(tensors)
    values = [_fill(a, stream) for a in call.args]
    n_pos = len(values) - len(call.kwargs)
    return tuple(values[:n_pos]), dict(zip(call.kwargs, values[n_pos:], strict=True))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Meta functions log a traceback before they raise; a refused combination is an answer here."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _target(call: Call) -> str:
    return str(call.op.name())  # "ns::name.overload", or "ns::name" for the default overload


# ---------------------------------------------------------------------------------------------
# the program's laws
# ---------------------------------------------------------------------------------------------
def laws_for(graph: Graph, has_rule: Mapping[str, frozenset[str] | None]) -> LawSet:
    """Checked laws for every opaque call of `graph` (the reference) no hand-written rule matches
    (`has_rule`: the literal arguments the rules require of each target, None for any),
    as rules for the calls of that target, literal arguments and ranks in every program.

    Calls that share a target and literal arguments share one function symbol, whatever their
    shapes; a law becomes a rule for them when it holds on every such call of the reference
    with those ranks (a rule states its operands' ranks), checked on each call's own shapes."""
    from .opaque_calls import opaque_attrs, opaque_key

    metas = {p.id: p.meta for p in graph.placeholders}
    metas.update({n.id: n.meta for n in graph.nodes})
    groups: dict[tuple[str, str, tuple[int, ...]], list[Call | None]] = {}
    for node in graph.nodes:
        if node.op != "generic" or not 0 < len(node.inputs) <= 4:
            continue
        target = str(node.attrs.get("target", ""))
        if target in has_rule and (has_rule[target] is None or opaque_attrs(node) in has_rule[target]):
            continue  # a hand-written rule matches this call
        inputs = [metas[i] for i in node.inputs]
        ranks = (*(m.ndim for m in inputs), node.meta.ndim)
        groups.setdefault((opaque_key(node), opaque_attrs(node), ranks), []).append(call_of(node, inputs))
    found = LawSet()
    for (key, attrs, ranks), calls in groups.items():
        if any(call is None for call in calls):
            continue  # a call that cannot be replayed cannot check a law
        replayable = [call for call in calls if call is not None]
        candidates = {law for call in replayable for law in _strategy_laws(call)}
        for law in sorted(candidates, key=str):
            applies = [call for call in replayable if _one_size(law, call)]
            problems = [problem for call in applies if (problem := _checked(call, law)) is not None]
            if problems:
                found.excluded.append((law, problems[0]))
            elif applies:
                found.laws.append(law)
                found.rules.append(law.rule(key, attrs, ranks))
    return found


# Answers kept for the worker's life, keyed by the call (target, literal arguments, shapes):
# DTensor's strategies and the concrete checks depend on nothing else.
_STRATEGIES: dict[str, list[Law]] = {}
_CHECKS: dict[tuple[str, Law], str | None] = {}


def _call_key(call: Call) -> str:
    return json.dumps([str(call.op), call.args, call.kwargs, [(m.shape, m.dtype) for m in call.metas]], default=str)


def _strategy_laws(call: Call) -> list[Law]:
    from .indexing_laws import indexing_laws

    key = _call_key(call)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = strategy_laws(call) + indexing_laws(call)
    return _STRATEGIES[key]


def _checked(call: Call, law: Law) -> str | None:
    from .law_check import check_law

    key = (_call_key(call), law)
    if key not in _CHECKS:
        _CHECKS[key] = check_law(call, law)
    return _CHECKS[key]
