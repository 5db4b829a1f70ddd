"""Data movement and casts: copies, slices (strided, scattered), narrow, select, transposes,
permutes, expand, cat, repeat, stack, repeat_interleave, each as the canonical movement ops."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from ..graph.model import TensorMeta
from ..relations.expr import norm_dim
from .lowering_tables import _slice_bounds


class MovementLowering:
    """Lowerings of the normalizer (`normalize._Builder`), by the op they handle (`op_<name>`)."""

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

    def op_constant_pad_nd(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A pad with a constant as what it is: the value between two blocks of that constant along
        each padded dim (DTensor pads an uneven shard before gathering it, and cuts the padding off
        after). Pads that crop (negative) stay an opaque call."""
        source = self.value(args[0])
        pads = list(args[1])
        value = args[2] if len(args) > 2 else kwargs.get("value", 0.0)
        if any(not isinstance(k, int) or k < 0 for k in pads) or not isinstance(value, (int, float)):
            return False
        current, shape = source, list(self.meta(source).shape)
        for i in range(0, len(pads), 2):
            dim, before, after = -1 - i // 2, pads[i], pads[i + 1]
            if not before and not after:
                continue
            pieces = [current]
            if before:
                pieces.insert(0, self._constant_block(fx, shape, dim, before, value, meta.dtype, f".pad{i // 2}before"))
            if after:
                pieces.append(self._constant_block(fx, shape, dim, after, value, meta.dtype, f".pad{i // 2}after"))
            shape[len(shape) + dim] += before + after
            last = not any(pads[i + 2 :])
            piece_meta = meta if last else TensorMeta(tuple(shape), meta.dtype)
            current = self.add(fx, "cat", pieces, {"dim": dim}, piece_meta, suffix="" if last else f".pad{i // 2}")
        if current == source:
            self.alias[fx.name] = source
        return True

    def _constant_block(
        self, fx: torch.fx.Node, shape: list[int], dim: int, width: int, value: float, dtype: Any, suffix: str
    ) -> str:
        """A block of `value` shaped like `shape` but `width` wide along `dim`."""
        block = (*shape[:dim], width, *shape[len(shape) + dim + 1 :])
        zero = {"zero": True} if value == 0 else {}
        key = ("full", block, value, dtype)
        return self.constant(fx, key, f"full[{list(block)}, {value}]", TensorMeta(block, dtype), suffix=suffix, **zero)

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
