"""ExportedProgram -> shardproof graph IR.

Canonical ops (the verifier's vocabulary; everything else becomes `generic` and is still
verified where ranks compute it on identical inputs, by congruence):

  data movement   slice(dim,start,end) cat(dim) view(shape) permute(perm) expand(shape)
  elementwise     unary(fn) scalar(fn,value) binary(fn) where fill(value)
  reductions      reduce(fn,dim,keepdim) softmax(dim) log_softmax(dim)
  along a dim     along(fn,dim,index,args): an op on each 1-d fiber along dim independently
                  (topk values / indices, sort, cumsum)
  indexing        pick(dim): x.gather(dim, i.unsqueeze(dim)).squeeze(dim), one entry per row
  contractions    linear matmul embedding sdpa(is_causal,scale,enable_gqa)
  collectives     all_reduce all_gather reduce_scatter all_to_all broadcast
                  p2p (a send or a receive between two ranks: pipeline stages)
  constants       constant(digest) uninitialized
  fallback        generic(target, attrs, output index)

Cross entropy is written out in the numerically stable form a vocabulary-parallel loss computes
(max, subtract, exp, sum, log, the target's entry), see `op_cross_entropy_loss`.
`einsum` of two operands is written as the permutes, views and one matmul it computes;
`one_hot(x, n)` as `unsqueeze(x, -1) == arange(n)`; `clamp` as scalar maximum / minimum.
A bmm / baddbmm (beta 0) over a batch that a view merged from two dims (Megatron's attention:
[b * heads, m, k]) becomes a matmul over both dims, viewed to the merged shape, and a value whose
dims were merged is that value again when viewed back: a shard of the heads stays a shard.

Dims are negative. Must run inside the rank's fake process-group context so collective group
names can be resolved to rank lists.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ..errors import UserCodeError
from ..graph.model import Collective, Graph, Node, Placeholder, SourceSite, TensorMeta
from ..relations.expr import norm_dim
from . import decompose
from .frames import parse_stack_trace

_ALIASES = {
    "wait_tensor",
    "clone",
    "contiguous",
    "alias",
    "detach",
    "lift_fresh_copy",
    "lift_fresh",
    "alias_copy",
    "detach_copy",
    "_conj",
    "resolve_conj",
    "resolve_neg",
}
_DROPPED = {
    "_assert_tensor_metadata",
    "_assert_scalar",
    "sym_constrain_range",
    "sym_constrain_range_for_size",
    "_assert_async",
    "sym_size",
    "sym_numel",
    "sym_stride",
}
_VIEWS = {
    "view",
    "_unsafe_view",
    "reshape",
    "unsqueeze",
    "squeeze",
    "flatten",
    "unflatten",
    "view_copy",
    "squeeze_copy",
    "unsqueeze_copy",
    "_reshape_alias",
    "_reshape_copy",
    "view_as",  # fairscale's identity mappings at world size 1 return their input as a view
}
_UNARY = {
    "neg",
    "silu",
    "relu",
    "rsqrt",
    "sqrt",
    "exp",
    "log",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "abs",
    "reciprocal",
    "logical_not",
    "bitwise_not",
    "erf",
    "exp2",
    "log1p",
    "expm1",
    "sign",
    "floor",
    "ceil",
    "round",
    "square",
    "hardtanh",
    "softplus",
    "gelu",
    "isnan",
    "isinf",
    "mish",
    "elu",
    "leaky_relu",
    "relu6",
    "hardsigmoid",
    "hardswish",
    "log2",
    "trunc",
    "frac",
}
_BINARY = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "maximum": "maximum",
    "minimum": "minimum",
    "pow": "pow",
    "eq": "eq",
    "ne": "ne",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "__or__": "or",
    "__and__": "and",
    "__xor__": "xor",
    "bitwise_or": "or",
    "bitwise_and": "and",
    "bitwise_xor": "xor",
    "logical_or": "or",
    "logical_and": "and",
    "logical_xor": "xor",
    "remainder": "remainder",
    "floor_divide": "floor_divide",
    "atan2": "atan2",
    "fmod": "fmod",
    "rsub": "rsub",
}
_REDUCTIONS = {
    "mean": "mean",
    "sum": "sum",
    "amax": "amax",
    "amin": "amin",
    "prod": "prod",
    "logsumexp": "logsumexp",
    "all": "all",
    "any": "any",
}
_COLLECTIVES = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast"}
_DETERMINISTIC_FACTORIES = {
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "eye",
    "scalar_tensor",
    "zeros_like",
    "ones_like",
    "full_like",
    "tensor",
}
_SHAPED_LIKE_FACTORIES = {"zeros_like", "ones_like", "full_like"}
_UNINITIALISED_FACTORIES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _meta_of(value: Any) -> TensorMeta | None:
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in value.shape), dtype_name(value.dtype))
    return None


def _slice_bounds(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """[start, end) of a slice of a dim of `size`, as Python clamps it (None: the whole dim)."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    return start, max(start, min(size, end + size if end < 0 else end))


_REAL_OF_COMPLEX = {"complex64": "float32", "complex128": "float64", "complex32": "float16"}


def _scalar_literal(value: torch.fx.Node) -> Any:
    """The number of `x[mask] = 0.0` (traced as index_put of `scalar_tensor(0.0)`), else None."""
    if value.op == "call_function" and getattr(value.target, "__name__", "").startswith("scalar_tensor"):
        number = value.args[0] if value.args else None
        if isinstance(number, int | float) and not isinstance(number, bool):
            return _literal(number)
    return None


def _all_zeros(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a factory call makes a tensor of zeros (a sum's start: `out = zeros_like(x)`)."""
    if name in ("zeros", "zeros_like"):
        return True
    if name in ("full", "full_like"):
        value = args[1] if len(args) > 1 else kwargs.get("fill_value")
    elif name == "scalar_tensor":
        value = args[0] if args else kwargs.get("s")
    else:
        return False
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _literal(value: Any) -> Any:
    """JSON-able rendering of a non-tensor argument."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.device | torch.layout | torch.memory_format):
        return str(value)
    if isinstance(value, list | tuple):
        return [_literal(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int | float | bool | str) or value is None:
        return value
    return repr(value)


class _Builder:
    def __init__(
        self,
        program: torch.export.ExportedProgram,
        name: str,
        rank: int | None,
        world_size: int,
        resolve_group: Callable[[str], tuple[int, ...]] | None,
        joint: bool = False,
    ) -> None:
        self.program = program
        self.joint = joint  # a functionalised forward-backward graph (capture/gradients.py)
        self.graph = Graph(name=name, rank=rank, world_size=world_size, placeholders=[], nodes=[], outputs=[])
        self.resolve_group = resolve_group
        self.alias: dict[str, str] = {}  # fx node name -> IR value id
        self.metas: dict[str, TensorMeta] = {}
        self.multi: dict[str, list[str | None]] = {}  # multi-output node -> ids of its outputs
        self.view_nodes: dict[str, str] = {}  # id of a node made by view() -> its source
        self.permute_nodes: dict[str, tuple[str, list[int]]] = {}  # id of a permute -> (source, perm)
        self.picks_viewed: set[str] = set()  # views of picks to the shape of a gather (see view())
        self.sends: set[str] = set()  # p2p sends (their tokens are not the program's outputs)
        self.nodes_by_id: dict[str, Node] = {}
        # complex value id -> ids of its real and imaginary parts (complex arithmetic in real terms)
        self.complex_parts: dict[str, tuple[str, str]] = {}
        self.decomposition_depth = 0  # how deep decompose.inline is in its own decompositions

    # -- helpers ----------------------------------------------------------------------------------
    def value(self, arg: Any) -> str:
        if not isinstance(arg, torch.fx.Node):
            raise TypeError(f"expected a tensor argument, got {arg!r}")
        return self.alias.get(arg.name, arg.name)

    def add(
        self,
        fx: torch.fx.Node,
        op: str,
        inputs: list[str],
        attrs: dict[str, Any],
        meta: TensorMeta,
        suffix: str = "",
        collective: Collective | None = None,
    ) -> str:
        node_id = fx.name + suffix
        module_path, module_type = _module_of(fx)
        node = Node(
            id=node_id,
            op=op,
            inputs=tuple(inputs),
            attrs=attrs,
            meta=meta,
            site=_site_of(fx),
            module_path=module_path,
            module_type=module_type,
            collective=collective,
            original=_target_name(fx),
        )
        self.graph.nodes.append(node)
        self.nodes_by_id[node_id] = node
        self.metas[node_id] = meta
        if node.site:
            self.graph.source_files.update(f.file for f in node.site.frames)
        return node_id

    def meta(self, value_id: str) -> TensorMeta:
        return self.metas[value_id]

    # -- main -----------------------------------------------------------------------------------
    def build(self) -> Graph:
        signature = self.program.graph_signature
        kinds: dict[str, tuple[str, str]] = {}
        for spec in signature.input_specs:
            arg_name = getattr(spec.arg, "name", None)
            if arg_name is None:
                continue
            kind = {
                "PARAMETER": "parameter",
                "BUFFER": "buffer",
                "CONSTANT_TENSOR": "constant",
                "USER_INPUT": "input",
                "CUSTOM_OBJ": "constant",
                "TOKEN": "constant",
            }.get(spec.kind.name, "constant")
            target = spec.target if spec.target is not None else arg_name
            kinds[arg_name] = (kind, target)
        user_input_index = 0
        for fx in self.program.graph.nodes:
            if fx.op == "placeholder":
                meta = _meta_of(fx.meta.get("val"))
                if meta is None:
                    continue
                kind, target = kinds.get(fx.name, ("input", fx.name))
                if kind == "input":
                    target = str(user_input_index)
                    user_input_index += 1
                self.graph.placeholders.append(Placeholder(fx.name, kind, target, meta))
                self.metas[fx.name] = meta
            elif fx.op == "call_function":
                try:
                    self.convert(fx)
                except Exception as exc:
                    if "DataDependent" not in type(exc).__name__:
                        raise
                    # a size the graph only knows as a symbol read from tensor data
                    site = _site_of(fx)
                    raise UserCodeError(
                        "this line produces a value whose size depends on the data (token counts as split "
                        "sizes, nonzero, boolean-mask indexing); shardproof captures with static shapes only: "
                        f"use a fixed capacity ({type(exc).__name__})",
                        site.innermost if site is not None else None,
                    ) from exc
            elif fx.op == "output":
                outs = fx.args[0]
                for out in outs if isinstance(outs, list | tuple) else [outs]:
                    if isinstance(out, torch.fx.Node):
                        self.graph.outputs.append(self.value(out))
        user_outputs = [s for s in signature.output_specs if s.kind.name == "USER_OUTPUT"]
        self.graph.outputs = self.graph.outputs[-len(user_outputs) :] if user_outputs else []
        # the tokens of sends, added to the outputs only to keep the sends (capture/remap.py)
        self.graph.outputs = [v for v in self.graph.outputs if v not in self.sends]
        return self.graph

    def convert(self, fx: torch.fx.Node) -> None:
        target = fx.target
        if target is operator.getitem:
            self.getitem(fx)
            return
        name = _op_name(fx)
        args, kwargs = list(fx.args), dict(fx.kwargs)
        val = fx.meta.get("val")
        meta = _meta_of(val)
        if name in _DROPPED:
            return
        if isinstance(val, list | tuple):
            self.multi_output(fx, name, args, kwargs)
            return
        if meta is None:
            return  # a scalar / symbolic computation; shapes are static
        handler = getattr(self, f"op_{name}", None)
        if handler is not None and handler(fx, args, kwargs, meta) is not False:
            return
        if name in _ALIASES:
            self.alias[fx.name] = self.value(args[0])
            return
        if name == "dropout" or name == "native_dropout":
            self.alias[fx.name] = self.value(args[0])
            return
        if name in _VIEWS:
            self.view(fx, self.value(args[0]), meta)
            return
        if name in _UNARY:
            attrs = {"fn": name}
            if name == "gelu":
                attrs["approximate"] = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
            self.add(fx, "unary", [self.value(args[0])], attrs, meta)
            return
        if name in _BINARY and kwargs.get("rounding_mode") is None:
            # (a division that rounds is not a division: it stays an opaque call)
            self.binary(fx, _BINARY[name], args, kwargs, meta)
            return
        if name in _REDUCTIONS:
            self.reduction(fx, _REDUCTIONS[name], args, kwargs, meta)
            return
        if name in _COLLECTIVES:
            self.collective(fx, name, args, meta)
            return
        if name in _DETERMINISTIC_FACTORIES and not any(isinstance(a, torch.fx.Node) for a in args):
            zero = {"zero": True} if _all_zeros(name, args, kwargs) else {}
            self.constant(fx, (name, _literal(args), _literal(kwargs), meta), f"{name}{_literal(args)}", meta, **zero)
            return
        if name in _SHAPED_LIKE_FACTORIES and all(not isinstance(a, torch.fx.Node) for a in args[1:]):
            # ones_like(x) reads only x's shape and dtype: the same constant wherever the shape is
            # the same (a backward seed, `ones_like(loss)`, on every rank, whatever the loss);
            # `like` names the value whose shape it takes (a seed's loss, for the localizer)
            key = (name, _literal(args[1:]), _literal(kwargs), meta)
            zero = {"zero": True} if _all_zeros(name, args, kwargs) else {}
            self.constant(fx, key, f"{name}{_literal(args[1:])}", meta, like=self.value(args[0]), **zero)
            return
        if name in _UNINITIALISED_FACTORIES:
            self.add(fx, "uninitialized", [], {}, meta)
            return
        if decompose.inline(self, fx):  # written out as torch's decomposition writes it
            return
        self.generic(fx, name, args, kwargs, meta)

    def constant(
        self,
        fx: torch.fx.Node,
        key: tuple[Any, ...],
        description: str,
        meta: TensorMeta,
        suffix: str = "",
        **attrs: Any,
    ) -> str:
        """A value fixed by `key` alone (a factory call and its literal arguments): equal keys, one term."""
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
        return self.add(
            fx, "constant", [], {"digest": digest, "description": description, **attrs}, meta, suffix=suffix
        )

    def generic(
        self,
        fx: torch.fx.Node,
        name: str,
        args: list[Any],
        kwargs: dict[str, Any],
        meta: TensorMeta,
        index: int = 0,
        suffix: str = "",
    ) -> str:
        inputs: list[str] = []
        literal_args: list[Any] = []
        for a in [*args, *kwargs.values()]:
            if isinstance(a, torch.fx.Node):
                inputs.append(self.value(a))
                literal_args.append("<tensor>")
            elif isinstance(a, list | tuple) and any(isinstance(x, torch.fx.Node) for x in a):
                for x in a:
                    if isinstance(x, torch.fx.Node):
                        inputs.append(self.value(x))
                literal_args.append(["<tensor>" if isinstance(x, torch.fx.Node) else _literal(x) for x in a])
            else:
                literal_args.append(_literal(a))
        attrs = {"target": _target_name(fx), "args": literal_args, "kwargs": sorted(kwargs), "index": index}
        return self.add(fx, "generic", inputs, attrs, meta, suffix=suffix)

    def multi_output(self, fx: torch.fx.Node, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        outputs = fx.meta["val"]
        if name in (
            "split",
            "split_with_sizes",
            "unbind",
            "chunk",
            "split_copy",
            "split_with_sizes_copy",
            "unbind_copy",
        ):
            source = self.value(args[0])
            meta = self.meta(source)
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
            if name.startswith("unbind"):
                dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            dim = norm_dim(dim, meta.ndim)
            ids: list[str | None] = []
            start = 0
            for i, out in enumerate(outputs):
                out_meta = _meta_of(out)
                assert out_meta is not None
                length = 1 if name.startswith("unbind") else out_meta.shape[meta.ndim + dim]
                sliced_shape = list(meta.shape)
                sliced_shape[meta.ndim + dim] = length
                sliced = self.add(
                    fx,
                    "slice",
                    [source],
                    {"dim": dim, "start": start, "end": start + length},
                    TensorMeta(tuple(sliced_shape), meta.dtype),
                    suffix=f".{i}",
                )
                if tuple(sliced_shape) != out_meta.shape:
                    sliced = self.add(
                        fx, "view", [sliced], {"shape": list(out_meta.shape)}, out_meta, suffix=f".{i}.view"
                    )
                ids.append(sliced)
                start += length
            self.multi[fx.name] = ids
            return
        if name in _ALONG and all(_meta_of(out) is not None for out in outputs):
            self.multi[fx.name] = [
                self.along(fx, name, args, kwargs, _meta_of(out), index=i, suffix=f".{i}")  # type: ignore[arg-type]
                for i, out in enumerate(outputs)
            ]
            return
        if name not in ("max", "min") and decompose.inline(self, fx):
            return
        ids = []
        for i, out in enumerate(outputs):
            out_meta = _meta_of(out)
            if out_meta is not None and i == 0 and name in ("max", "min") and len(args) > 1:
                # max(x, dim)[0] is amax(x, dim): the values, whatever happens to the indices
                dim = norm_dim(args[1], self.meta(self.value(args[0])).ndim)
                keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
                attrs = {"fn": "a" + name, "dim": dim, "keepdim": keepdim}
                ids.append(self.add(fx, "reduce", [self.value(args[0])], attrs, out_meta, suffix=f".{i}"))
                continue
            ids.append(
                None if out_meta is None else self.generic(fx, name, args, kwargs, out_meta, index=i, suffix=f".{i}")
            )
        self.multi[fx.name] = ids

    def getitem(self, fx: torch.fx.Node) -> None:
        source, index = fx.args
        assert isinstance(source, torch.fx.Node)
        ids = self.multi.get(source.name)
        if ids is None or not isinstance(index, int) or ids[index] is None:
            return
        self.alias[fx.name] = ids[index]  # type: ignore[assignment]

    def view(self, fx: torch.fx.Node, source: str, meta: TensorMeta, suffix: str = "") -> str:
        # A value whose dims were merged and are viewed back to its own shape is that value
        # (row-major both ways): Megatron flattens its all-gather buffer and views it back, and its
        # attention merges batch and heads for bmm. So is a pick viewed back from the shape a
        # gather or a flattened index gives it. Other chains stay as they are (a repeat of one
        # key/value head is a view of an expand of a view, which the repeat rules recognise), the
        # view rules follow them one step at a time.
        producer = self.view_nodes.get(source)
        merged = producer is not None and self.meta(source).ndim < self.meta(producer).ndim
        # in a joint graph, a value with size-1 dims added or dropped and viewed back (an in-place
        # collective on a gradient that is a view of its reduction's [1, 1, n] result, once
        # functionalised); forward graphs keep such chains for the key/value repeat rules
        unit_dims = (
            self.joint
            and producer is not None
            and _without_ones(self.meta(source).shape) == _without_ones(self.meta(producer).shape)
        )
        if (
            producer is not None
            and (merged or unit_dims or source in self.picks_viewed)
            and self.meta(producer).shape == meta.shape
        ):
            source = producer
        if self.meta(source).shape == meta.shape:
            if not suffix:
                self.alias[fx.name] = source
            return source
        node_id = self.add(fx, "view", [source], {"shape": list(meta.shape)}, meta, suffix=suffix)
        self.view_nodes[node_id] = source
        return node_id

    def scalar_or_value(self, arg: Any) -> tuple[str | None, Any]:
        if isinstance(arg, torch.fx.Node):
            return self.value(arg), None
        return None, _literal(arg)

    def binary(self, fx: torch.fx.Node, fn: str, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> None:
        left, right = args[0], args[1] if len(args) > 1 else kwargs.get("other")
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if fn in ("add", "sub") and alpha != 1 and isinstance(right, torch.fx.Node):
            right_id = self.value(right)
            right_id = self.add(
                fx, "scalar", [right_id], {"fn": "mul", "value": _literal(alpha)}, self.meta(right_id), suffix=".alpha"
            )
            self.add(fx, "binary", [self.value(left), right_id], {"fn": fn}, meta)
            return
        if fn == "rsub":
            if isinstance(right, torch.fx.Node):
                self.add(fx, "binary", [self.value(right), self.value(left)], {"fn": "sub"}, meta)
            else:
                negated = self.add(
                    fx, "unary", [self.value(left)], {"fn": "neg"}, self.meta(self.value(left)), suffix=".neg"
                )
                self.add(fx, "scalar", [negated], {"fn": "add", "value": _literal(right)}, meta)
            return
        left_id, left_scalar = self.scalar_or_value(left)
        right_id, right_scalar = self.scalar_or_value(right)
        if left_id is not None and right_id is not None:
            node_id = self.add(fx, "binary", [left_id, right_id], {"fn": fn}, meta)
            if fn == "mul" and meta.dtype.startswith("complex"):
                self.complex_product(fx, node_id, left_id, right_id, meta)
        elif left_id is not None:
            self.add(fx, "scalar", [left_id], {"fn": fn, "value": right_scalar}, meta)
        elif right_id is not None:
            self.add(fx, "scalar", [right_id], {"fn": f"r{fn}", "value": left_scalar}, meta)

    # -- complex numbers, in real terms ----------------------------------------------------------
    # Meta's Llama code rotates queries and keys as complex numbers: view_as_complex, a complex
    # product with the rotary table, view_as_real. Each complex value also gets its real and
    # imaginary parts as real nodes, the product is written out (re = ar*br - ai*bi, im = ar*bi +
    # ai*br) and view_as_real stacks the parts again, so the real rules follow a head shard through
    # the rotation. The complex nodes stay in the graph for any other consumer.
    def parts(self, fx: torch.fx.Node, value_id: str) -> tuple[str, str]:
        if value_id not in self.complex_parts:
            complex_meta = self.meta(value_id)
            real_meta = TensorMeta(complex_meta.shape, _REAL_OF_COMPLEX.get(complex_meta.dtype, "float32"))
            self.complex_parts[value_id] = (
                self.add(fx, "unary", [value_id], {"fn": "real"}, real_meta, suffix=f".{value_id}.real"),
                self.add(fx, "unary", [value_id], {"fn": "imag"}, real_meta, suffix=f".{value_id}.imag"),
            )
        return self.complex_parts[value_id]

    def complex_product(self, fx: torch.fx.Node, node_id: str, left: str, right: str, meta: TensorMeta) -> None:
        (ar, ai), (br, bi) = self.parts(fx, left), self.parts(fx, right)
        real = TensorMeta(meta.shape, _REAL_OF_COMPLEX.get(meta.dtype, "float32"))

        def step(fn: str, a: str, b: str, suffix: str) -> str:
            return self.add(fx, "binary", [a, b], {"fn": fn}, real, suffix=suffix)

        re = step("sub", step("mul", ar, br, ".rr"), step("mul", ai, bi, ".ii"), ".re")
        im = step("add", step("mul", ar, bi, ".ri"), step("mul", ai, br, ".ir"), ".im")
        self.complex_parts[node_id] = (re, im)

    def op_view_as_complex(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        src_meta = self.meta(source)
        part_meta = TensorMeta(src_meta.shape[:-1], src_meta.dtype)
        pieces = []
        for index, name in ((0, "real"), (1, "imag")):
            piece_meta = TensorMeta((*src_meta.shape[:-1], 1), src_meta.dtype)
            bounds = {"dim": -1, "start": index, "end": index + 1}
            piece = self.add(fx, "slice", [source], bounds, piece_meta, suffix=f".{name}.slice")
            pieces.append(self.add(fx, "view", [piece], {"shape": list(part_meta.shape)}, part_meta, suffix=f".{name}"))
        node_id = self.generic(fx, "view_as_complex", args, kwargs, meta)
        self.complex_parts[node_id] = (pieces[0], pieces[1])
        return True

    def op_view_as_real(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        re, im = self.parts(fx, self.value(args[0]))
        piece_meta = TensorMeta((*meta.shape[:-1], 1), meta.dtype)
        stacked = [
            self.add(fx, "view", [part], {"shape": list(piece_meta.shape)}, piece_meta, suffix=f".{name}")
            for part, name in ((re, "real"), (im, "imag"))
        ]
        self.add(fx, "cat", stacked, {"dim": -1}, meta)
        return True

    def reduction(self, fx: torch.fx.Node, fn: str, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> None:
        source = self.value(args[0])
        src_meta = self.meta(source)
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        if dims is None or dims == []:
            dims = list(range(src_meta.ndim))
        if isinstance(dims, int):
            dims = [dims]
        # outermost first: removing a dim leaves the (negative) numbers of the dims inside it as
        # they were, so each step names a dim of the value it reduces
        dims = sorted(norm_dim(d, src_meta.ndim) for d in dims)
        every_element = len(dims) == src_meta.ndim > 1 and not keepdim
        if fn == "mean" and len(dims) > 1 and not every_element:
            self.generic(fx, "mean", args, kwargs, meta)
            return
        self._reduce(fx, source, fn, dims, keepdim, meta)

    def _reduce(
        self, fx: torch.fx.Node, source: str, fn: str, dims: list[int], keepdim: bool, meta: TensorMeta
    ) -> None:
        """`source` reduced by `fn` over `dims` (negative, outermost first), one dim at a time; the
        last step is fx's value (of `meta`'s dtype). The mean of every element is the mean of the
        flattened value (a loss averaged over tokens, whatever the shape they come in)."""
        src_meta = self.meta(source)
        # (in a joint graph a sum of every element too: a loss summed over a micro-batch and
        # divided by the step's item count is then the same reduction as the reference's mean)
        if (fn == "mean" or (fn == "sum" and self.joint)) and len(dims) == src_meta.ndim > 1 and not keepdim:
            flat = TensorMeta((math.prod(src_meta.shape),), src_meta.dtype)
            source = self.view(fx, source, flat, suffix=".flat")
            src_meta, dims = flat, [-1]
        current, current_meta = source, src_meta
        for i, d in enumerate(dims):
            shape = list(current_meta.shape)
            if keepdim:
                shape[current_meta.ndim + d] = 1
            else:
                del shape[current_meta.ndim + d]
            step_meta = (
                TensorMeta(tuple(shape), meta.dtype)
                if i == len(dims) - 1
                else TensorMeta(tuple(shape), current_meta.dtype)
            )
            current = self.add(
                fx,
                "reduce",
                [current],
                {"fn": fn, "dim": d, "keepdim": keepdim},
                step_meta,
                suffix="" if i == len(dims) - 1 else f".{i}",
            )
            current_meta = step_meta
        if not dims:
            self.alias[fx.name] = source

    def collective(self, fx: torch.fx.Node, name: str, args: list[Any], meta: TensorMeta) -> None:
        source = self.value(args[0])
        group_name = str(args[-1])
        group = self.resolve_group(group_name) if self.resolve_group else ()
        if len(group) == 1 and self.meta(source) == meta:
            # A collective over one rank is the identity (the same code at world size 1 as the reference).
            self.alias[fx.name] = source
            return
        if name == "all_reduce":
            coll = Collective("all_reduce", str(args[1]), group)
        elif name == "all_gather_into_tensor":
            coll = Collective("all_gather", None, group, dim=0)
        elif name == "reduce_scatter_tensor":
            coll = Collective("reduce_scatter", str(args[1]), group, dim=0)
        elif name == "all_to_all_single":
            out_splits = tuple(int(s) for s in args[1]) if args[1] is not None else None
            in_splits = tuple(int(s) for s in args[2]) if args[2] is not None else None
            coll = Collective("all_to_all", None, group, dim=0, output_splits=out_splits, input_splits=in_splits)
        else:  # broadcast: src is a group-local rank
            local_src = int(args[1])
            coll = Collective("broadcast", None, group, src=group[local_src] if group else local_src)
        self.add(fx, coll.kind, [source], {}, meta, collective=coll)

    # -- ops with their own handling ------------------------------------------------------------
    def op_copy(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[1])
        if self.meta(source) == meta:
            self.alias[fx.name] = source
            return True
        return False

    def op_copy_(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """Training IR: a collective's result written back into its buffer (see mutation_free)."""
        return self.op_copy(fx, args, kwargs, meta)

    def op__to_copy(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        return self._cast(fx, self.value(args[0]), meta)

    def op_to(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        return self._cast(fx, self.value(args[0]), meta)

    def op_type_as(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        return self._cast(fx, self.value(args[0]), meta)

    def _cast(self, fx: torch.fx.Node, source: str, meta: TensorMeta) -> bool:
        if self.meta(source).dtype == meta.dtype:
            self.alias[fx.name] = source
        else:
            self.add(fx, "unary", [source], {"fn": f"cast_{meta.dtype}"}, meta)
        return True

    def op_slice(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        src_meta = self.meta(source)
        dim = args[1] if len(args) > 1 else 0
        step = args[4] if len(args) > 4 else 1
        d = norm_dim(dim, src_meta.ndim)
        size = src_meta.shape[src_meta.ndim + d]
        start, end = _slice_bounds(size, args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else None)
        if step != 1:
            return self.strided_slice(fx, source, d, start, end, step, meta)
        if start == 0 and end == size:
            self.alias[fx.name] = source
            return True
        self.add(fx, "slice", [source], {"dim": d, "start": start, "end": end}, meta)
        return True

    def strided_slice(
        self, fx: torch.fx.Node, source: str, dim: int, start: int, end: int, step: int, meta: TensorMeta
    ) -> bool:
        """x[..., start:end:step] as what it reads: the dim split into (size / step, step), one index
        of the inner part, the rest merged back (the interleaved halves x[..., ::2] and x[..., 1::2]
        of GPT-J-style rotary embeddings; rows dealt round-robin, W[rank::world_size]). Only when
        the step divides the dim and the slice runs to its end less than a step away."""
        src_meta = self.meta(source)
        nd = src_meta.ndim
        size = src_meta.shape[nd + dim]
        offset = start % step
        if size % step or start >= step or end < size - step + 1 + offset or meta.shape[nd + dim] != size // step:
            return False
        split = (*src_meta.shape[: nd + dim], size // step, step, *src_meta.shape[nd + dim + 1 :])
        grouped = self.add(fx, "view", [source], {"shape": list(split)}, TensorMeta(split, meta.dtype), suffix=".rows")
        picked_shape = (*split[: nd + dim + 1], 1, *split[nd + dim + 2 :])
        picked = self.add(
            fx,
            "slice",
            [grouped],
            {"dim": dim, "start": offset, "end": offset + 1},
            TensorMeta(picked_shape, meta.dtype),
            suffix=".pick",
        )
        self.view(fx, picked, meta)
        return True

    def op_slice_scatter(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """base with base[start:end] along dim replaced by src: base's slices around src, concatenated.
        (Functionalised writes into a preallocated buffer: Megatron's all-gather buffer.)"""
        base, src = self.value(args[0]), self.value(args[1])
        base_meta = self.meta(base)
        dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
        step = args[5] if len(args) > 5 else kwargs.get("step", 1)
        if step != 1:
            return False
        d = norm_dim(dim, base_meta.ndim)
        size = base_meta.shape[base_meta.ndim + d]
        start, end = _slice_bounds(
            size, args[3] if len(args) > 3 else kwargs.get("start"), args[4] if len(args) > 4 else kwargs.get("end")
        )
        parts = []
        for index, (lo, hi, piece) in enumerate([(0, start, base), (start, end, src), (end, size, base)]):
            if hi <= lo:
                continue
            if piece == src:
                parts.append(src)
                continue
            shape = list(base_meta.shape)
            shape[base_meta.ndim + d] = hi - lo
            parts.append(
                self.add(
                    fx,
                    "slice",
                    [base],
                    {"dim": d, "start": lo, "end": hi},
                    TensorMeta(tuple(shape), base_meta.dtype),
                    suffix=f".kept{index}",
                )
            )
        if len(parts) == 1:
            self.alias[fx.name] = parts[0]
        else:
            self.add(fx, "cat", parts, {"dim": d}, meta)
        return True

    def op_narrow(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        start = args[2]
        return self.op_slice(fx, [args[0], args[1], start, start + args[3]], kwargs, meta)

    def op_select(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        src_meta = self.meta(source)
        d = norm_dim(args[1], src_meta.ndim)
        size = src_meta.shape[src_meta.ndim + d]
        index = args[2] + size if args[2] < 0 else args[2]
        shape = list(src_meta.shape)
        shape[src_meta.ndim + d] = 1
        sliced = self.add(
            fx,
            "slice",
            [source],
            {"dim": d, "start": index, "end": index + 1},
            TensorMeta(tuple(shape), src_meta.dtype),
            suffix=".slice",
        )
        self.add(fx, "view", [sliced], {"shape": list(meta.shape)}, meta)
        return True

    def op_transpose(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        nd = self.meta(source).ndim
        a, b = args[1] % nd, args[2] % nd
        perm = list(range(nd))
        perm[a], perm[b] = perm[b], perm[a]
        return self._permute(fx, source, perm, meta)

    def op_t(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        nd = self.meta(source).ndim
        return self._permute(fx, source, list(range(nd))[::-1], meta)

    def op_permute(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        nd = self.meta(source).ndim
        return self._permute(fx, source, [p % nd for p in args[1]], meta)

    def _permute(self, fx: torch.fx.Node, source: str, perm: list[int], meta: TensorMeta) -> bool:
        if self.joint and source in self.permute_nodes:
            # in a joint graph, a transpose of a transpose (an in-place collective on a weight's
            # gradient, which autograd keeps as the transpose of a product, once functionalised)
            # is one permutation of the first one's source, or that source
            source, inner = self.permute_nodes[source]
            perm = [inner[p] for p in perm]
        if perm == sorted(perm):
            self.alias[fx.name] = source
        else:
            node_id = self.add(fx, "permute", [source], {"perm": perm}, meta)
            self.permute_nodes[node_id] = (source, perm)
        return True

    def op_expand(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        source = self.value(args[0])
        if self.meta(source).shape == meta.shape:
            self.alias[fx.name] = source
        else:
            self.add(fx, "expand", [source], {"shape": list(meta.shape)}, meta)
        return True

    def op_cat(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        every_part = [self.value(a) for a in args[0] if isinstance(a, torch.fx.Node)]
        parts = [p for p in every_part if math.prod(self.meta(p).shape) > 0]
        dim = norm_dim(args[1] if len(args) > 1 else kwargs.get("dim", 0), meta.ndim)
        if not parts:
            self.add(fx, "uninitialized", [], {}, meta)  # an empty tensor: no values to relate
        elif len(parts) == 1 and self.meta(parts[0]).shape == meta.shape:
            self.alias[fx.name] = parts[0]
        elif len(parts) == 1:
            self.add(fx, "view", parts, {"shape": list(meta.shape)}, meta)
        else:
            self.add(fx, "cat", parts, {"dim": dim}, meta)
        return True

    def op_repeat(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """`x.repeat(..)` tiling one dim r times: the concatenation of r copies along it."""
        source = self.value(args[0])
        src_meta = self.meta(source)
        repeats = [int(r) for r in args[1]]
        if len(repeats) != src_meta.ndim:
            return False
        tiled = [d for d, r in enumerate(repeats) if r != 1]
        if len(tiled) != 1:
            return False
        dim = tiled[0] - src_meta.ndim
        self.add(fx, "cat", [source] * repeats[tiled[0]], {"dim": dim}, meta)
        return True

    def op_stack(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        dim = norm_dim(args[1] if len(args) > 1 else kwargs.get("dim", 0), meta.ndim)
        parts = []
        for i, a in enumerate(args[0]):
            part = self.value(a)
            part_meta = self.meta(part)
            shape = list(part_meta.shape)
            shape.insert(meta.ndim + dim, 1)
            parts.append(
                self.add(
                    fx, "view", [part], {"shape": shape}, TensorMeta(tuple(shape), part_meta.dtype), suffix=f".{i}"
                )
            )
        self.add(fx, "cat", parts, {"dim": dim}, meta)
        return True

    def op_repeat_interleave(
        self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta
    ) -> bool:
        """x.repeat_interleave(n, dim) with an int n: each slice along dim repeated n times in place,
        i.e. a new axis after dim, expanded to n, merged back (how repeat_kv is written by hand)."""
        if len(args) < 2 or not isinstance(args[1], int):
            return False
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        if not isinstance(dim, int):
            return False
        source = self.value(args[0])
        source_meta = self.meta(source)
        nd = source_meta.ndim
        axis = dim % nd
        repeats = args[1]
        with_axis = list(source_meta.shape)
        with_axis.insert(axis + 1, 1)
        unsqueezed = self.add(
            fx, "view", [source], {"shape": with_axis}, TensorMeta(tuple(with_axis), source_meta.dtype), suffix=".axis"
        )
        expanded_shape = list(with_axis)
        expanded_shape[axis + 1] = repeats
        expanded = self.add(
            fx,
            "expand",
            [unsqueezed],
            {"shape": expanded_shape},
            TensorMeta(tuple(expanded_shape), source_meta.dtype),
            suffix=".expand",
        )
        self.add(fx, "view", [expanded], {"shape": list(meta.shape)}, meta)
        return True

    def op_linear(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        x, w = self.value(args[0]), self.value(args[1])
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        if bias is None:
            self.add(fx, "linear", [x, w], {}, meta)
        else:
            product = self.add(fx, "linear", [x, w], {}, meta, suffix=".nobias")
            self.add(fx, "binary", [product, self.value(bias)], {"fn": "add"}, meta)
        return True

    def op_mm(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        if fx.target is not torch.ops.aten.matmul.default and self.decomposed_linear(fx, args, None, meta):
            return True
        self.add(fx, "matmul", [self.value(args[0]), self.value(args[1])], {}, meta)
        return True

    op_matmul = op_mm

    def decomposed_linear(self, fx: torch.fx.Node, args: list[Any], bias: Any, meta: TensorMeta) -> bool:
        """`linear` as core aten writes it: `mm(view(x, [-1, k]), permute(w, [1, 0]))` (and `addmm`
        with the bias), viewed back to x's leading dims afterwards. Written as the linear it is,
        so a parallel program decomposed to core aten (DTensor) meets a reference that calls
        `nn.Linear`; the flattening view stays, and the view back collapses onto the linear."""
        flat, transposed = args[0], args[1]
        if not (isinstance(flat, torch.fx.Node) and isinstance(transposed, torch.fx.Node)):
            return False
        if getattr(transposed.target, "__name__", "") not in ("permute.default", "t.default"):
            return False
        if transposed.target is torch.ops.aten.permute.default and list(transposed.args[1]) not in ([1, 0], [-1, -2]):
            return False
        weight = transposed.args[0]
        flat_meta = self.meta(self.value(flat))
        source = flat
        if getattr(flat.target, "__name__", "") in ("view.default", "_unsafe_view.default", "reshape.default"):
            candidate = flat.args[0]
            candidate_meta = self.meta(self.value(candidate)) if isinstance(candidate, torch.fx.Node) else None
            if (
                candidate_meta is not None
                and candidate_meta.ndim > 2
                and candidate_meta.shape[-1] == flat_meta.shape[-1]
                and math.prod(candidate_meta.shape[:-1]) == flat_meta.shape[0]
            ):
                source = candidate
        source_meta = self.meta(self.value(source))
        full = TensorMeta((*source_meta.shape[:-1], meta.shape[-1]), meta.dtype)
        unflattened = source is not flat
        product = self.add(fx, "linear", [self.value(source), self.value(weight)], {}, full, suffix=".linear")
        if bias is not None:
            product = self.add(
                fx, "binary", [product, self.value(bias)], {"fn": "add"}, full, suffix=".bias" if unflattened else ""
            )
        if unflattened:
            node_id = self.add(fx, "view", [product], {"shape": list(meta.shape)}, meta)
            self.view_nodes[node_id] = product
        elif bias is None:
            self.alias[fx.name] = product
        return True

    def op_bmm(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        if not self.unmerged_bmm(fx, self.value(args[0]), self.value(args[1]), 1, meta):
            self.add(fx, "matmul", [self.value(args[0]), self.value(args[1])], {}, meta)
        return True

    def op_baddbmm(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        if beta != 0:  # beta 0 ignores the input (Megatron passes an uninitialised buffer)
            return False
        a, b = self.value(args[1]), self.value(args[2])
        if self.unmerged_bmm(fx, a, b, alpha, meta):
            return True
        if alpha == 1:
            self.add(fx, "matmul", [a, b], {}, meta)
        else:
            product = self.add(fx, "matmul", [a, b], {}, meta, suffix=".mm")
            self.add(fx, "scalar", [product], {"fn": "mul", "value": _literal(alpha)}, meta)
        return True

    def merged_form(self, value_id: str, depth: int = 0) -> tuple[str, list[int], int] | None:
        """(S, perm, pos) when `value_id` is `permute(S, perm)` with its dims pos and pos + 1 merged
        into one by a view (through any permutes that keep the merged dim whole)."""
        node = self.nodes_by_id.get(value_id)
        if node is None or depth > 4:
            return None
        if node.op == "view":
            source = node.inputs[0]
            full, merged = self.meta(source).shape, node.meta.shape
            if len(full) != len(merged) + 1:
                return None
            for pos in range(len(merged)):
                if (
                    full[:pos] == merged[:pos]
                    and full[pos + 2 :] == merged[pos + 1 :]
                    and full[pos] * full[pos + 1] == merged[pos]
                ):
                    return source, list(range(len(full))), pos
            return None
        if node.op == "permute":
            inner = self.merged_form(node.inputs[0], depth + 1)
            if inner is None:
                return None
            source, perm, pos = inner
            local: list[int] = []
            for j in node.attrs["perm"]:
                local += [pos, pos + 1] if j == pos else [j if j < pos else j + 1]
            return source, [perm[i] for i in local], list(node.attrs["perm"]).index(pos)
        return None

    def unmerged_bmm(self, fx: torch.fx.Node, a: str, b: str, alpha: Any, meta: TensorMeta) -> bool:
        """A bmm over a batch merged from two dims (Megatron: [b * heads, m, k]) as a matmul over
        both dims, viewed to the merged shape: a shard of the heads stays a shard."""
        forms = [self.merged_form(a), self.merged_form(b)]
        if any(form is None or form[2] != 0 for form in forms):
            return False
        operands = []
        for index, (source, perm, _pos) in enumerate(forms):  # type: ignore[misc]
            shape = tuple(self.meta(source).shape[d] for d in perm)
            if perm == sorted(perm):
                operands.append(source)
            else:
                operands.append(
                    self.add(
                        fx,
                        "permute",
                        [source],
                        {"perm": perm},
                        TensorMeta(shape, self.meta(source).dtype),
                        suffix=f".unmerged{index}",
                    )
                )
        batch_a, batch_b = self.meta(operands[0]).shape[:2], self.meta(operands[1]).shape[:2]
        if batch_a != batch_b:
            return False
        full = TensorMeta((*batch_a, *meta.shape[1:]), meta.dtype)
        product = self.add(fx, "matmul", operands, {}, full, suffix=".batched")
        if alpha != 1:
            product = self.add(fx, "scalar", [product], {"fn": "mul", "value": _literal(alpha)}, full, suffix=".alpha")
        node_id = self.add(fx, "view", [product], {"shape": list(meta.shape)}, meta)
        self.view_nodes[node_id] = product
        return True

    def op_addmm(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            return False
        if self.decomposed_linear(fx, args[1:], args[0], meta):
            return True
        product = self.add(fx, "matmul", [self.value(args[1]), self.value(args[2])], {}, meta, suffix=".mm")
        self.add(fx, "binary", [product, self.value(args[0])], {"fn": "add"}, meta)
        return True

    def op_rms_norm(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """`rms_norm` written out as torch's own decomposition does (pow, mean, add eps, rsqrt,
        mul, mul weight, in float32 for half inputs), so a reference calling `nn.RMSNorm` and a
        parallel program decomposed to core aten (DTensor) meet in the same operations."""
        normalized_shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        eps = args[3] if len(args) > 3 else kwargs.get("eps")
        if not isinstance(normalized_shape, list | tuple) or len(normalized_shape) != 1:
            return False
        source = self.value(args[0])
        src_meta = self.meta(source)
        upcast = "float32" if src_meta.dtype in ("float16", "bfloat16") else src_meta.dtype
        if eps is None:
            eps = torch.finfo(torch.float32 if upcast == "float32" else torch.float64).eps
        wide = TensorMeta(src_meta.shape, upcast)
        kept = TensorMeta((*src_meta.shape[:-1], 1), upcast)
        if upcast != src_meta.dtype:
            source = self.add(fx, "unary", [source], {"fn": f"cast_{upcast}"}, wide, suffix=".upcast")
        squared = self.add(fx, "scalar", [source], {"fn": "pow", "value": 2}, wide, suffix=".square")
        mean = self.add(fx, "reduce", [squared], {"fn": "mean", "dim": -1, "keepdim": True}, kept, suffix=".mean")
        shifted = self.add(fx, "scalar", [mean], {"fn": "add", "value": _literal(eps)}, kept, suffix=".eps")
        inverse = self.add(fx, "unary", [shifted], {"fn": "rsqrt"}, kept, suffix=".rsqrt")
        steps: list[tuple[str, list[str], dict[str, Any]]] = [("binary", [source, inverse], {"fn": "mul"})]
        if isinstance(weight, torch.fx.Node):
            steps.append(("binary", ["<previous>", self.value(weight)], {"fn": "mul"}))
        if upcast != meta.dtype:
            steps.append(("unary", ["<previous>"], {"fn": f"cast_{meta.dtype}"}))
        previous = ""
        for i, (op, inputs, attrs) in enumerate(steps):
            last = i == len(steps) - 1
            inputs = [previous if value == "<previous>" else value for value in inputs]
            previous = self.add(fx, op, inputs, attrs, meta if last else wide, suffix="" if last else f".step{i}")
        return True

    def op_embedding(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        padding_idx = args[2] if len(args) > 2 else kwargs.get("padding_idx", -1)
        self.add(fx, "embedding", [self.value(args[0]), self.value(args[1])], {"padding_idx": padding_idx}, meta)
        return True

    def op_scaled_dot_product_attention(
        self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta
    ) -> bool:
        q, k, v = (self.value(a) for a in args[:3])
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
        if dropout not in (0, 0.0):
            return False
        attrs = {
            "is_causal": bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False)),
            "scale": _literal(kwargs.get("scale", args[6] if len(args) > 6 else None)),
            "enable_gqa": bool(kwargs.get("enable_gqa", args[7] if len(args) > 7 else False)),
        }
        inputs = [q, k, v] + ([self.value(mask)] if isinstance(mask, torch.fx.Node) else [])
        self.add(fx, "sdpa", inputs, attrs, meta)
        return True

    def op_masked_fill(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        x, mask, value = args[0], args[1], args[2]
        if isinstance(value, torch.fx.Node):
            self.add(fx, "where", [self.value(mask), self.value(value), self.value(x)], {}, meta)
        else:
            self.add(fx, "fill", [self.value(x), self.value(mask)], {"value": _literal(value)}, meta)
        return True

    def op_where(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        if len(args) < 3:
            return False
        cond, a, b = args[0], args[1], args[2]
        # masked_fill decomposed to core aten: where(mask, scalar_tensor(value), x)
        literal = _scalar_literal(a) if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) else None
        if literal is not None:
            self.add(fx, "fill", [self.value(b), self.value(cond)], {"value": literal}, meta)
        elif isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
            self.add(fx, "where", [self.value(cond), self.value(a), self.value(b)], {}, meta)
        elif isinstance(b, torch.fx.Node):
            self.add(fx, "fill", [self.value(b), self.value(cond)], {"value": _literal(a)}, meta)
        else:
            return False
        return True

    def op_index_put(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        x, indices, value = args[0], args[1], args[2]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        if accumulate or len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
            return False
        mask = indices[0]
        mask_meta = _meta_of(mask.meta.get("val"))
        value_meta = _meta_of(value.meta.get("val")) if isinstance(value, torch.fx.Node) else None
        if mask_meta is None or mask_meta.dtype != "bool" or value_meta is None or value_meta.shape != ():
            return False
        # x[mask] = scalar_tensor: a fill where the mask broadcasts over the trailing dims.
        mask_id = self.value(mask)
        if mask_meta.ndim < meta.ndim:
            shape = list(mask_meta.shape) + [1] * (meta.ndim - mask_meta.ndim)
            mask_id = self.add(
                fx, "view", [mask_id], {"shape": shape}, TensorMeta(tuple(shape), "bool"), suffix=".mask"
            )
        literal = _scalar_literal(value)
        if literal is not None:
            self.add(fx, "fill", [self.value(x), mask_id], {"value": literal}, meta)
        else:
            self.add(fx, "where", [mask_id, self.value(value), self.value(x)], {}, meta)
        return True

    def op_gather(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """x.gather(d, i) with one index per row (i.unsqueeze(d)): the picked entries, viewed with
        the unit dim (a squeeze after it gives the pick itself)."""
        source, index = self.value(args[0]), self.value(args[2])
        src_meta, index_meta = self.meta(source), self.meta(index)
        dim = norm_dim(args[1], src_meta.ndim)
        if index_meta.ndim != src_meta.ndim or index_meta.shape[dim] != 1:
            return False
        rows = tuple(size for i, size in enumerate(src_meta.shape) if i != src_meta.ndim + dim)
        if tuple(size for i, size in enumerate(index_meta.shape) if i != index_meta.ndim + dim) != rows:
            return False
        unsqueezed = self.view_nodes.get(index)  # i.unsqueeze(d): the pick's index is i itself
        if unsqueezed is not None and self.meta(unsqueezed).shape == rows:
            index = unsqueezed
        else:
            index = self.view(fx, index, TensorMeta(rows, index_meta.dtype), suffix=".index")
        picked = self.add(fx, "pick", [source, index], {"dim": dim}, TensorMeta(rows, meta.dtype), suffix=".pick")
        self.picks_viewed.add(self.view(fx, picked, meta))
        return True

    def op_index(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """x[arange(N), i] on a [N, C] x (fairscale's and Megatron's predicted logits): the pick of
        row n's entry i[n]."""
        indices = args[1]
        if not isinstance(indices, list | tuple) or len(indices) != 2:
            return False
        rows, index = indices
        source = self.value(args[0])
        src_meta = self.meta(source)
        if src_meta.ndim != 2 or not isinstance(index, torch.fx.Node) or not _is_arange(rows, src_meta.shape[0]):
            return False
        index_id = self.value(index)
        if self.meta(index_id).shape != (src_meta.shape[0],):
            return False
        unflat = self._unflattened(source, index_id)
        if unflat is None:
            self.add(fx, "pick", [source, index_id], {"dim": -1}, meta)
            return True
        # picked from logits flattened to [N, C] by targets flattened to [N]: the pick of the
        # unflattened ones, flattened (viewed back to the targets' shape, it is that pick)
        source, index_id = unflat
        rows = TensorMeta(self.meta(index_id).shape, meta.dtype)
        picked = self.add(fx, "pick", [source, index_id], {"dim": -1}, rows, suffix=".pick")
        self.picks_viewed.add(self.view(fx, picked, meta))
        return True

    def _unflattened(self, logits: str, targets: str) -> tuple[str, str] | None:
        """(x, t) when logits = x.view(-1, C) and targets = t.view(-1) with t of x's leading shape."""
        unflat_logits, unflat_targets = self.view_nodes.get(logits), self.view_nodes.get(targets)
        if unflat_logits is None or unflat_targets is None or self.meta(logits).ndim != 2:
            return None
        shape, target_shape = self.meta(unflat_logits).shape, self.meta(unflat_targets).shape
        if not shape or shape[-1] != self.meta(logits).shape[-1] or target_shape != shape[:-1]:
            return None
        return unflat_logits, unflat_targets

    def op_cross_entropy_loss(
        self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta
    ) -> bool:
        """cross_entropy(x, t) with class indices, written out as a vocabulary-parallel loss
        computes it: m = max(x), z = x - m, s = sum(exp(z)), loss = log(s) - z[t]; with label
        smoothing e, (1 - e) * loss + e * (log(s) - sum(z) / C). The same function (for any m
        constant along the classes) in the form whose pieces a parallel program computes on its
        vocabulary shard. Targets are taken to be class indices in [0, C), as token ids are for
        an embedding: the ignore index (-100) is none of them. Logits and targets flattened
        for the loss (`x.view(-1, C)`, `t.view(-1)`) are taken as they were, and the per-token
        loss flattened after."""

        def arg(i: int, name: str, default: Any) -> Any:
            return args[i] if len(args) > i else kwargs.get(name, default)

        weight, reduction = arg(2, "weight", None), arg(3, "reduction", 1)
        smoothing = float(arg(5, "label_smoothing", 0.0))
        logits, targets = self.value(args[0]), self.value(args[1])
        logits_meta, targets_meta = self.meta(logits), self.meta(targets)
        if weight is not None or reduction not in (0, 1, 2) or targets_meta.dtype not in ("int64", "int32"):
            return False
        if logits_meta.ndim < 1 or targets_meta.ndim != logits_meta.ndim - 1:
            return False
        class_dim = 1 - logits_meta.ndim if logits_meta.ndim > 1 else -1
        flattened: tuple[int, ...] | None = None
        unflat = self._unflattened(logits, targets)
        if unflat is not None:
            flattened = targets_meta.shape
            logits, targets = unflat
            logits_meta, targets_meta = self.meta(logits), self.meta(targets)
            class_dim = -1
        dtype = logits_meta.dtype
        classes = logits_meta.shape[class_dim]
        rows = TensorMeta(targets_meta.shape, dtype)
        kept_shape = list(logits_meta.shape)
        kept_shape[class_dim] = 1
        kept = TensorMeta(tuple(kept_shape), dtype)

        def step(op: str, inputs: list[str], attrs: dict[str, Any], step_meta: TensorMeta, name: str) -> str:
            return self.add(fx, op, inputs, attrs, step_meta, suffix=f".{name}")

        largest = step("reduce", [logits], {"fn": "amax", "dim": class_dim, "keepdim": False}, rows, "max")
        largest = self.view(fx, largest, kept, suffix=".max_kept")
        shifted = step("binary", [logits, largest], {"fn": "sub"}, logits_meta, "shifted")
        exps = step("unary", [shifted], {"fn": "exp"}, logits_meta, "exp")
        total = step("reduce", [exps], {"fn": "sum", "dim": class_dim, "keepdim": False}, rows, "sum_exp")
        log_total = step("unary", [total], {"fn": "log"}, rows, "log_sum_exp")
        picked = step("pick", [shifted, targets], {"dim": class_dim}, rows, "target")
        loss = step("binary", [log_total, picked], {"fn": "sub"}, rows, "nll")
        if smoothing:
            summed = step("reduce", [shifted], {"fn": "sum", "dim": class_dim, "keepdim": False}, rows, "sum")
            mean = step("scalar", [summed], {"fn": "div", "value": classes}, rows, "mean")
            uniform = step("binary", [log_total, mean], {"fn": "sub"}, rows, "smooth")
            kept_loss = step("scalar", [loss], {"fn": "mul", "value": 1.0 - smoothing}, rows, "nll_share")
            smooth = step("scalar", [uniform], {"fn": "mul", "value": smoothing}, rows, "smooth_share")
            loss = step("binary", [kept_loss, smooth], {"fn": "add"}, rows, "smoothed")
        if flattened is not None:
            loss = self.view(fx, loss, TensorMeta(flattened, dtype), suffix=".flat")
        if reduction == 0:
            self.alias[fx.name] = loss
        else:  # the mean or sum over every token, as `loss.mean()` / `loss.sum()` is read
            every = list(range(-self.meta(loss).ndim, 0))
            self._reduce(fx, loss, "mean" if reduction == 1 else "sum", every, False, meta)
        return True

    def op_p2p_send(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A send to `peer`: one side of a point-to-point call whose source is this rank."""
        return self._p2p(fx, self.value(args[0]), int(args[1]), sending=True, meta=meta)

    def op_p2p_recv(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A receive from `peer`: the value that rank sends."""
        return self._p2p(fx, self.value(args[0]), int(args[1]), sending=False, meta=meta)

    def _p2p(self, fx: torch.fx.Node, source: str, peer: int, sending: bool, meta: TensorMeta) -> bool:
        rank = self.graph.rank if self.graph.rank is not None else 0
        pair = tuple(sorted((rank, peer)))
        coll = Collective("p2p", None, pair, src=rank if sending else peer)
        node_id = self.add(fx, "p2p", [source], {"peer": peer, "send": sending}, meta, collective=coll)
        if sending:
            self.sends.add(node_id)
        return True

    def op_softmax(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """Written out as torch decomposes it (the max, the exponentials of the differences, their
        sum, the quotient): a softmax over a sharded dim is then the vocabulary-parallel softmax
        (a max all-reduce and a sum all-reduce) its ranks compute. A softmax whose decomposition
        cannot be traced stays one operation."""
        if decompose.inline(self, fx):
            return True
        source = self.value(args[0])
        self.add(fx, "softmax", [source], {"dim": norm_dim(args[1], meta.ndim)}, meta)
        return True

    op__softmax = op_softmax

    def op_log_softmax(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """Written out as torch decomposes it (x - max - log(sum(exp(x - max)))), as `op_softmax`:
        over a sharded dim it is then what DTensor's `loss_parallel()` and Megatron compute."""
        if decompose.inline(self, fx):
            return True
        source = self.value(args[0])
        self.add(fx, "log_softmax", [source], {"dim": norm_dim(args[1], meta.ndim)}, meta)
        return True

    op__log_softmax = op_log_softmax

    # -- ops along one dim, one_hot, clamp, einsum --------------------------------------------------
    def along(
        self,
        fx: torch.fx.Node,
        name: str,
        args: list[Any],
        kwargs: dict[str, Any],
        meta: TensorMeta,
        index: int = 0,
        suffix: str = "",
    ) -> str:
        """An op that maps every 1-d fiber along `dim` on its own (the dim's size may change):
        a selection of any other dim commutes with it."""
        source = self.value(args[0])
        position = _ALONG[name]
        dim = args[position] if len(args) > position else kwargs.get("dim", -1)
        dim = norm_dim(dim, self.meta(source).ndim)
        rest = [_literal(a) for i, a in enumerate(args[1:], start=1) if i != position]
        rest += [[key, _literal(value)] for key, value in sorted(kwargs.items()) if key != "dim"]
        attrs = {"fn": name, "dim": dim, "index": index, "args": rest}
        return self.add(fx, "along", [source], attrs, meta, suffix=suffix)

    def op_cumsum(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        self.along(fx, "cumsum", args, kwargs, meta)
        return True

    def op_one_hot(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """one_hot(x, n) is unsqueeze(x, -1) == arange(n), as int64: elementwise in x."""
        source = self.value(args[0])
        classes = meta.shape[-1]
        src_meta = self.meta(source)
        column = self.view(fx, source, TensorMeta((*src_meta.shape, 1), src_meta.dtype), suffix=".column")
        arange = self.constant(
            fx, ("arange", classes, "int64"), f"arange({classes})", TensorMeta((classes,), "int64"), suffix=".classes"
        )
        hit = self.add(fx, "binary", [column, arange], {"fn": "eq"}, TensorMeta(meta.shape, "bool"), suffix=".eq")
        self.add(fx, "unary", [hit], {"fn": "cast_" + meta.dtype}, meta)
        return True

    def op_clamp(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        low = args[1] if len(args) > 1 else kwargs.get("min")
        high = args[2] if len(args) > 2 else kwargs.get("max")
        if any(isinstance(bound, torch.fx.Node) for bound in (low, high)) or (low is None and high is None):
            return False
        value = self.value(args[0])
        if low is not None:
            attrs = {"fn": "maximum", "value": _literal(low)}
            value = self.add(fx, "scalar", [value], attrs, meta, suffix=".min" if high is not None else "")
        if high is not None:
            self.add(fx, "scalar", [value], {"fn": "minimum", "value": _literal(high)}, meta)
        return True

    def op_einsum(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A two-operand einsum without repeated or summed-alone letters, as it computes: permute
        each operand to (batch, free, contracted) / (batch, contracted, free), merge the free and
        the contracted letters by views, one matmul, and a view and a permute to the output."""
        equation, operands = args[0], args[1] if len(args) > 1 else None
        if not isinstance(equation, str) or not isinstance(operands, list | tuple) or len(operands) != 2:
            return False
        spec = _einsum_plan(equation.replace(" ", ""))
        if spec is None:
            return False
        a_letters, b_letters, out_letters = spec
        a, b = self.value(operands[0]), self.value(operands[1])
        sizes: dict[str, int] = {}
        for letters, value in ((a_letters, a), (b_letters, b)):
            shape = self.meta(value).shape
            if len(shape) != len(letters):
                return False
            for letter, size in zip(letters, shape, strict=True):
                if sizes.setdefault(letter, size) != size:
                    return False  # broadcasting a size-1 dim: leave it to congruence
        batch = [c for c in out_letters if c in a_letters and c in b_letters]
        left = [c for c in a_letters if c not in b_letters]
        right = [c for c in b_letters if c not in a_letters]
        contracted = [c for c in a_letters if c in b_letters and c not in out_letters]
        dtype = meta.dtype

        def arrange(value: str, letters: str, order: list[str], groups: list[list[str]], tag: str) -> str:
            perm = [letters.index(c) for c in order]
            if perm != sorted(perm):
                shape = tuple(sizes[c] for c in order)
                value = self.add(fx, "permute", [value], {"perm": perm}, TensorMeta(shape, dtype), suffix=f".{tag}p")
            merged = tuple(math.prod(sizes[c] for c in group) for group in groups)
            if merged != self.meta(value).shape:
                value = self.view(fx, value, TensorMeta(merged, dtype), suffix=f".{tag}v")
            return value

        batch_groups = [[c] for c in batch]
        # Without batch letters the right operand is a matrix, and matmul broadcasts the left
        # operand's leading dims: its free letters stay separate (`bsh,oh->bso` is x @ W.T, not
        # a view of (x viewed as rows) @ W.T), so the product meets the linear map it computes.
        left_groups = [[c] for c in left] if not batch and left else [left]
        lhs = arrange(a, a_letters, batch + left + contracted, [*batch_groups, *left_groups, contracted], "a")
        rhs = arrange(b, b_letters, batch + contracted + right, [*batch_groups, contracted, right], "b")
        product_shape = (
            *(sizes[c] for c in batch),
            *(math.prod(sizes[c] for c in group) for group in left_groups),
            math.prod(sizes[c] for c in right),
        )
        order = batch + left + right
        unmerged = tuple(sizes[c] for c in order)
        perm = [order.index(c) for c in out_letters]
        last_is_product = unmerged == product_shape and perm == sorted(perm)
        product = self.add(
            fx, "matmul", [lhs, rhs], {}, TensorMeta(product_shape, dtype), suffix="" if last_is_product else ".mm"
        )
        if last_is_product:
            return True
        if perm == sorted(perm):
            self.view(fx, product, meta)
            return True
        if unmerged != product_shape:
            product = self.view(fx, product, TensorMeta(unmerged, dtype), suffix=".unmerged")
        self.add(fx, "permute", [product], {"perm": perm}, meta)
        return True


# ops along one dim: name -> position of the dim among the arguments
_ALONG = {"topk": 2, "sort": 1, "cumsum": 1, "cumprod": 1, "cummax": 1, "cummin": 1}


def _einsum_plan(equation: str) -> tuple[str, str, str] | None:
    """(a, b, out) letters of a two-operand einsum that `op_einsum` writes out, else None."""
    if "->" not in equation or "." in equation:
        return None
    inputs, out = equation.split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    terms = (a, b, out)
    if not all(t.isalpha() and len(set(t)) == len(t) for t in terms if t) or not a or not b:
        return None
    if any(c not in a and c not in b for c in out):
        return None
    if any((c in a) != (c in b) and c not in out for c in a + b):
        return None  # a letter summed over one operand only
    return a, b, out


def _is_arange(value: Any, length: int) -> bool:
    """Whether value is torch.arange(length) (start 0, step 1)."""
    if not isinstance(value, torch.fx.Node) or _op_name(value) != "arange":
        return False
    numbers = [a for a in value.args if isinstance(a, int)]
    start = value.kwargs.get("start", numbers[0] if len(numbers) > 1 else 0)
    end = value.kwargs.get("end", numbers[1] if len(numbers) > 1 else (numbers[0] if numbers else None))
    step = value.kwargs.get("step", numbers[2] if len(numbers) > 2 else 1)
    return (start, end, step) == (0, length, 1)


def _op_name(fx: torch.fx.Node) -> str:
    target = fx.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def _target_name(fx: torch.fx.Node) -> str:
    target = fx.target
    if hasattr(target, "name") and callable(target.name):
        return str(target.name())
    return str(target)


def _site_of(fx: torch.fx.Node) -> SourceSite | None:
    return parse_stack_trace(fx.meta.get("stack_trace"))


def _module_of(fx: torch.fx.Node) -> tuple[str, str]:
    stack = fx.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, module_type = list(stack.values())[-1]
    return str(path), str(module_type)


def _without_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def to_graph(
    program: torch.export.ExportedProgram,
    name: str,
    rank: int | None,
    world_size: int,
    resolve_group: Callable[[str], tuple[int, ...]] | None = None,
    joint: bool = False,
) -> Graph:
    return _Builder(program, name, rank, world_size, resolve_group, joint).build()
