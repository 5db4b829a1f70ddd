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
from ..graph.model import Collective, Graph, Node, Placeholder, TensorMeta
from ..relations.expr import norm_dim
from . import decompose
from .folding import MAX_ELEMENTS, ConstantFolder, frontier_constants, masked_positions, value_digest
from .leading_dims import unflatten_leading_dims
from .lower_arithmetic import ArithmeticLowering
from .lower_contractions import ContractionLowering
from .lower_functions import FunctionLowering
from .lower_indexing import IndexingLowering
from .lower_movement import MovementLowering
from .lowering_tables import (
    _ALIASES,
    _ALONG,
    _BINARY,
    _COLLECTIVES,
    _DETERMINISTIC_FACTORIES,
    _DROPPED,
    _REDUCTIONS,
    _SHAPED_LIKE_FACTORIES,
    _UNARY,
    _UNINITIALISED_FACTORIES,
    _VIEWS,
    _all_zeros,
    _literal,
    _meta_of,
    _module_of,
    _op_name,
    _site_of,
    _target_name,
    _without_ones,
)


class _Builder(MovementLowering, ContractionLowering, IndexingLowering, FunctionLowering, ArithmeticLowering):
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
        self.folder = ConstantFolder()  # values computed from constants alone (folding.py)
        self.folded: dict[str, torch.Tensor] = {}  # value id -> its folded value
        self.scalar_constants: dict[str, Any] = {}  # lifted 0-dim constants -> their numbers

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
                digest = None
                if kind == "constant":
                    self._note_constant(fx.name, target)
                    digest = self._lifted_constant(fx.name, target, meta)
                self.graph.placeholders.append(Placeholder(fx.name, kind, target, meta, digest))
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
        self.graph.constants = frontier_constants(self.graph, self.folded)
        unflatten_leading_dims(self.graph)
        return self.graph

    def _lifted_constant(self, name: str, target: str, meta: TensorMeta) -> str | None:
        """A tensor the forward made from literals (`torch.tensor([...])`: ALiBi's slopes), which
        export lifts with its value: a constant like any folded value (its digest; the values
        computed from it are folded in turn)."""
        value = getattr(self.program, "constants", {}).get(target)
        if isinstance(value, torch.Tensor) and value.device.type == "meta":  # traced on meta (program.py)
            value = getattr(self.program, "literal_values", {}).get(target)
        if not isinstance(value, torch.Tensor) or value.device.type == "meta" or value.is_complex():
            return None
        if tuple(value.shape) != meta.shape or value.numel() > MAX_ELEMENTS:
            return None
        value = value.detach().cpu()
        self.folder.values[name] = value
        self.folded[name] = value
        return value_digest(value)

    def convert(self, fx: torch.fx.Node) -> None:
        self._convert(fx)
        value = self.folder.fold(fx)
        if value is not None:
            self.note_folded(self.alias.get(fx.name, fx.name), value)

    def note_folded(self, value_id: str, value: torch.Tensor) -> None:
        """Record a node's value computed from constants alone (folding.py) on the node."""
        node = self.nodes_by_id.get(value_id)
        if node is not None and node.meta.shape == tuple(value.shape):
            node.attrs["folded"] = value_digest(value)
            self.folded[node.id] = value
            masked = masked_positions(value)
            if masked is not None:
                node.attrs["neg_inf_at"] = masked
            if value.dtype == torch.bool and value.numel() and not bool(value.any()):
                node.attrs["sets_nothing"] = True  # a mask a fill with it leaves every value of

    def _convert(self, fx: torch.fx.Node) -> None:
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
            p, train = (args[1] if len(args) > 1 else 0.0), (args[2] if len(args) > 2 else True)
            site = _site_of(fx)
            if p and train is not False and site is not None:
                self.graph.identity_dropouts.append(site)
            return
        if name in _VIEWS:
            self.view(fx, self.value(args[0]), meta)
            return
        if name in _UNARY:
            if name == "bitwise_not" and meta.dtype == "bool":
                name = "logical_not"  # `~mask`: on booleans the bitwise and the logical not agree
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
            if out_meta is not None and i < 2 and name in ("max", "min") and len(args) > 1:
                # max(x, dim) is (amax(x, dim), argmax(x, dim)): the values and their indices
                dim = norm_dim(args[1], self.meta(self.value(args[0])).ndim)
                keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
                attrs = {"fn": ("a", "arg")[i] + name, "dim": dim, "keepdim": keepdim}
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
        flattened value (a loss averaged over tokens, whatever the shape they come in).

        A mean is written as what it computes, as torch's own reference `mean` writes it: the sum
        over the dims divided by the number of elements summed. A program that sums its block of
        a dim, all-reduces the sums and divides by the whole dim's length then meets the
        reference's mean in the same operations, and a division by another number (the block's
        length) is the one operation that differs."""
        src_meta = self.meta(source)
        # (in a joint graph a sum of every element too: a loss summed over a micro-batch and
        # divided by the step's item count is then the same reduction as the reference's mean)
        if (fn == "mean" or (fn == "sum" and self.joint)) and len(dims) == src_meta.ndim > 1 and not keepdim:
            flat = TensorMeta((math.prod(src_meta.shape),), src_meta.dtype)
            source = self.view(fx, source, flat, suffix=".flat")
            src_meta, dims = flat, [-1]
        if not dims:
            self.alias[fx.name] = source
            return
        if fn == "logsumexp":
            self._logsumexp(fx, source, dims, keepdim, meta)
            return
        count = math.prod(src_meta.shape[d] for d in dims)
        divided = fn == "mean" and count != 1
        current, current_meta = source, src_meta
        for i, d in enumerate(dims):
            shape = list(current_meta.shape)
            if keepdim:
                shape[current_meta.ndim + d] = 1
            else:
                del shape[current_meta.ndim + d]
            last = i == len(dims) - 1
            step_meta = TensorMeta(tuple(shape), meta.dtype) if last else TensorMeta(tuple(shape), current_meta.dtype)
            suffix = (".mean_sum" if divided else "") if last else f".{i}"
            attrs = {"fn": "sum" if fn == "mean" else fn, "dim": d, "keepdim": keepdim}
            current = self.add(fx, "reduce", [current], attrs, step_meta, suffix=suffix)
            current_meta = step_meta
        if divided:
            self.add(fx, "scalar", [current], {"fn": "div", "value": count}, meta)

    def _logsumexp(self, fx: torch.fx.Node, source: str, dims: list[int], keepdim: bool, meta: TensorMeta) -> None:
        """log(sum(exp(x))) over `dims`, written out as torch's reference `logsumexp` computes it:
        the largest element m along a dim, then m + log(sum(exp(x - m))) (the same function for any
        m constant along the dim: exp(x - m) = exp(x) / exp(m)). A vocabulary-parallel program
        computes these pieces on its shard (the maximum all-reduced with MAX, the sum of the
        shifted exponentials all-reduced: Megatron's form, a z-loss), so written out, the
        reference meets it in the same operations, as a softmax or a cross entropy does (the
        reductions without their dim, as the cross entropy's; a program keeping it meets them
        through the reductions' kept twins, verify/encode.py). Over several dims, one dim at a
        time: the logsumexp over (a, b) is that over a of that over b. The last step is fx's
        value (of `meta`'s dtype)."""
        current, current_meta = source, self.meta(source)
        for i, d in enumerate(dims):
            last = i == len(dims) - 1
            dtype = meta.dtype if last else current_meta.dtype
            kept_shape = list(current_meta.shape)
            kept_shape[current_meta.ndim + d] = 1
            rows_shape = list(current_meta.shape)
            del rows_shape[current_meta.ndim + d]
            rows, kept = TensorMeta(tuple(rows_shape), dtype), TensorMeta(tuple(kept_shape), dtype)

            def step(op: str, inputs: list[str], attrs: dict[str, Any], step_meta: TensorMeta, name: str) -> str:
                return self.add(fx, op, inputs, attrs, step_meta, suffix=f".lse{i}_{name}")  # noqa: B023

            largest = step("reduce", [current], {"fn": "amax", "dim": d, "keepdim": False}, rows, "max")
            largest_kept = self.view(fx, largest, kept, suffix=f".lse{i}_max_kept")
            shifted = step("binary", [current, largest_kept], {"fn": "sub"}, current_meta, "shifted")
            exps = step("unary", [shifted], {"fn": "exp"}, current_meta, "exp")
            total = step("reduce", [exps], {"fn": "sum", "dim": d, "keepdim": False}, rows, "sum_exp")
            logged = step("unary", [total], {"fn": "log"}, rows, "log_sum_exp")
            # the step's value: the sum, or with keepdim that sum viewed with the size-1 dim
            suffix = "" if last else f".lse{i}"
            summed = self.add(
                fx, "binary", [logged, largest], {"fn": "add"}, rows, f".lse{i}_rows" if keepdim else suffix
            )
            current, current_meta = (self.view(fx, summed, kept, suffix=suffix), kept) if keepdim else (summed, rows)

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

    def op_p2p_send(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A send to `peer`: one side of a point-to-point call whose source is this rank."""
        return self._p2p(fx, self.value(args[0]), int(args[1]), sending=True, blocking=bool(args[2]), meta=meta)

    def op_p2p_recv(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A receive from `peer`: the value that rank sends."""
        return self._p2p(fx, self.value(args[0]), int(args[1]), sending=False, blocking=bool(args[2]), meta=meta)

    def _p2p(self, fx: torch.fx.Node, source: str, peer: int, sending: bool, blocking: bool, meta: TensorMeta) -> bool:
        rank = self.graph.rank if self.graph.rank is not None else 0
        pair = tuple(sorted((rank, peer)))
        coll = Collective("p2p", None, pair, src=rank if sending else peer)
        attrs = {"peer": peer, "send": sending, "blocking": blocking}
        node_id = self.add(fx, "p2p", [source], attrs, meta, collective=coll)
        if sending:
            self.sends.add(node_id)
        return True


def to_graph(
    program: torch.export.ExportedProgram,
    name: str,
    rank: int | None,
    world_size: int,
    resolve_group: Callable[[str], tuple[int, ...]] | None = None,
    joint: bool = False,
) -> Graph:
    return _Builder(program, name, rank, world_size, resolve_group, joint).build()
