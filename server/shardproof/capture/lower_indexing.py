"""Indexing: embedding lookups, masked_fill / where, index_put, gather (a target's entry), index,
one_hot, and cross entropy written out in the numerically stable form a vocabulary-parallel loss
computes."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.fx

from ..graph.model import TensorMeta
from ..relations.expr import norm_dim
from . import example_values
from .lowering_tables import _filled_with, _is_arange, _literal, _meta_of, _scalar_literal

_INDEX_TYPES = (torch.int64, torch.int32)
_PASSING_VALUES = (torch.ops.aten.detach_, torch.ops.aten.detach, torch.ops.aten.alias, torch.ops.aten.lift_fresh_copy)


class IndexingLowering:
    """Lowerings of the normalizer (`normalize._Builder`), by the op they handle (`op_<name>`)."""

    def op_embedding(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        padding_idx = args[2] if len(args) > 2 else kwargs.get("padding_idx", -1)
        self.add(fx, "embedding", [self.value(args[0]), self.value(args[1])], {"padding_idx": padding_idx}, meta)
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
        # masked_fill decomposed to core aten: where(mask, scalar_tensor(value), x); a branch of one
        # number everywhere (`zeros_like(ids)`) is that number
        both = isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)
        literal = self._uniform(a, b, meta) if both else None
        # (a constant kept where the condition holds is folded as it is: no negation is added)
        kept_literal = None
        if both and literal is None and a.name not in self.folder.values:
            kept_literal = self._uniform(b, a, meta)
        if literal is not None:
            self.add(fx, "fill", [self.value(b), self.value(cond)], {"value": literal}, meta)
        elif kept_literal is not None:  # where(c, x, number): x filled where c does not hold
            negated = self._negation(fx, self.value(cond))
            self.add(fx, "fill", [self.value(a), negated], {"value": kept_literal}, meta)
        elif both:
            self.add(fx, "where", [self.value(cond), self.value(a), self.value(b)], {}, meta)
        elif isinstance(b, torch.fx.Node):
            self.add(fx, "fill", [self.value(b), self.value(cond)], {"value": _literal(a)}, meta)
        else:
            return False
        return True

    def _uniform(self, branch: torch.fx.Node, other: torch.fx.Node, meta: TensorMeta) -> Any:
        """The number every element of `branch` holds, when the where's result is `other` with
        some elements replaced by it (`other` has the result's shape and type), else None: a
        `scalar_tensor`, a factory of one value (`zeros_like`, `full`), or a constant evaluated
        while capturing (folding.py) whose elements are all equal."""
        other_meta = _meta_of(other.meta.get("val"))
        if other_meta is None or other_meta.shape != meta.shape or other_meta.dtype != meta.dtype:
            return None
        literal = _filled_with(branch)
        if literal is None:
            value = self.folder.values.get(branch.name)
            if value is not None and value.numel() and not value.is_complex() and value.dtype != torch.bool:
                first = value.reshape(-1)[0]
                if bool((value == first).all()):
                    literal = _literal(first.item())
        return literal

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
        row n's entry i[n]; and x[..., [a, a + s, ...], ...] (one index of known evenly spaced
        positions, Falcon's `qkv[..., [-2], :]`): the slice it reads."""
        indices = args[1]
        if self._evenly_spaced(fx, args[0], indices, meta):
            return True
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

    def _evenly_spaced(self, fx: torch.fx.Node, source: Any, indices: Any, meta: TensorMeta) -> bool:
        """Indexing one dim by a constant 1-D index of positions a, a + s, ..., a + (n - 1) s (s >= 1,
        negative positions counted from the end) reads what x[..., a : a + n s : s, ...] reads: with
        one index tensor, its dim stays where it was."""
        if not isinstance(indices, list | tuple) or not isinstance(source, torch.fx.Node):
            return False
        given = [(dim, index) for dim, index in enumerate(indices) if index is not None]
        if len(given) != 1 or not isinstance(given[0][1], torch.fx.Node):
            return False
        dim, index = given[0]
        value = self._known_index(index)
        if value is None or value.ndim != 1 or value.numel() == 0 or value.dtype not in _INDEX_TYPES:
            return False
        size = self.meta(self.value(source)).shape[dim]
        positions = [int(p) + size if int(p) < 0 else int(p) for p in value.tolist()]
        if not all(0 <= p < size for p in positions):
            return False
        step = positions[1] - positions[0] if len(positions) > 1 else 1
        if step < 1 or any(b - a != step for a, b in itertools.pairwise(positions)):
            return False
        start, end = positions[0], positions[-1] + 1
        return self.op_slice(fx, [source, dim, start, end, step], {}, meta)

    def _known_index(self, index: torch.fx.Node) -> torch.Tensor | None:
        """The value of a constant index (export reads a lifted one through an in-place detach_)."""
        while index.name not in self.folder.values and index.op == "call_function" and index.args:
            if getattr(index.target, "overloadpacket", None) not in _PASSING_VALUES or not isinstance(
                index.args[0], torch.fx.Node
            ):
                return None
            index = index.args[0]
        return self.folder.values.get(index.name)

    def _unflattened(self, logits: str, targets: str) -> tuple[str, str] | None:
        """(x, t) when logits = x.view(-1, C) and targets = t.view(-1) with t of x's leading shape."""
        unflat_logits, unflat_targets = self.view_nodes.get(logits), self.view_nodes.get(targets)
        if unflat_logits is None or unflat_targets is None or self.meta(logits).ndim != 2:
            return None
        shape, target_shape = self.meta(unflat_logits).shape, self.meta(unflat_targets).shape
        if not shape or shape[-1] != self.meta(logits).shape[-1] or target_shape != shape[:-1]:
            return None
        return unflat_logits, unflat_targets

    def _classes_moved(self, logits: str, class_dim: int) -> tuple[str, int] | None:
        """(x, d) when the logits are x with its dim d moved to the class position and its other
        dims kept in order (`x.transpose(1, 2)` of [batch, seq, classes], torch's [batch,
        classes, seq] layout): the loss of each position is the same on x along d."""
        node = self.nodes_by_id.get(logits)
        if node is None or node.op != "permute" or not node.inputs:
            return None
        perm = [p % len(node.attrs["perm"]) for p in node.attrs["perm"]]
        position = len(perm) + class_dim
        others = perm[:position] + perm[position + 1 :]
        if others != sorted(others):
            return None
        return node.inputs[0], perm[position] - len(perm)

    def op_cross_entropy_loss(
        self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta
    ) -> bool:
        """cross_entropy(x, t) with class indices, written out as a vocabulary-parallel loss
        computes it: m = max(x), z = x - m, s = sum(exp(z)), loss = log(s) - z[t]; with label
        smoothing e, (1 - e) * loss + e * (log(s) - sum(z) / C). The same function (for any m
        constant along the classes) in the form whose pieces a parallel program computes on its
        vocabulary shard. Targets are taken to be class indices in [0, C), as token ids are for
        an embedding: the ignore index (-100) is none of them, unless the example's targets show
        otherwise (`_ignoring`). Logits and targets flattened for the loss (`x.view(-1, C)`,
        `t.view(-1)`) are taken as they were, and the per-token loss flattened after."""

        def arg(i: int, name: str, default: Any) -> Any:
            return args[i] if len(args) > i else kwargs.get(name, default)

        weight, reduction = arg(2, "weight", None), arg(3, "reduction", 1)
        ignore_index, smoothing = int(arg(4, "ignore_index", -100)), float(arg(5, "label_smoothing", 0.0))
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
        permuted = self._classes_moved(logits, class_dim)
        if permuted is not None:
            logits, class_dim = permuted
            logits_meta = self.meta(logits)
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
        ignored = self._ignoring(fx, targets, ignore_index, classes)
        if ignored is not None:
            loss = step("fill", [loss, ignored], {"value": 0.0}, rows, "nll_kept")
            if reduction == 1:
                self._mean_over_kept(fx, loss, ignored, meta)
                return True
        if flattened is not None:
            loss = self.view(fx, loss, TensorMeta(flattened, dtype), suffix=".flat")
        if reduction == 0:
            self.alias[fx.name] = loss
        else:  # the mean or sum over every token, as `loss.mean()` / `loss.sum()` is read
            every = list(range(-self.meta(loss).ndim, 0))
            self._reduce(fx, loss, "mean" if reduction == 1 else "sum", every, False, meta)
        return True

    def _ignoring(self, fx: torch.fx.Node, targets: str, ignore_index: int, classes: int) -> str | None:
        """The mask of the targets equal to the ignore index, when the example's targets (an input,
        or a view or slice of one: labels shifted for next-token prediction) hold a value outside
        [0, C): torch leaves those tokens out of the loss and of the mean's count (example_values.py);
        None when they are class indices throughout."""
        source = targets
        while (node := self.nodes_by_id.get(source)) is not None and node.op in ("view", "slice") and node.inputs:
            source = node.inputs[0]
        placeholder = next((p for p in self.graph.placeholders if p.id == source and p.kind == "input"), None)
        if placeholder is None or not placeholder.target.isdigit():
            return None
        observed = example_values.input_range(int(placeholder.target))
        if observed is None or (observed[0] >= 0 and observed[1] < classes):
            return None
        mask = TensorMeta(self.meta(targets).shape, "bool")
        return self.add(fx, "scalar", [targets], {"fn": "eq", "value": ignore_index}, mask, suffix=".ignored")

    def _mean_over_kept(self, fx: torch.fx.Node, loss: str, ignored: str, meta: TensorMeta) -> None:
        """The mean of the per-token loss over the tokens not ignored, as torch's reduction takes
        it: the sum of the loss (zero where ignored) over the count of the rest, each summed one
        dim at a time as a program's `.sum()` is (over the targets' own shape)."""
        loss_meta = self.meta(loss)
        kept = self.add(fx, "unary", [ignored], {"fn": "logical_not"}, self.meta(ignored), suffix=".kept")
        counted = self.add(fx, "unary", [kept], {"fn": "cast_" + loss_meta.dtype}, loss_meta, suffix=".counted")
        every = list(range(-loss_meta.ndim, 0))
        total = self._summed(fx, loss, every, meta, "loss_sum")
        count = self._summed(fx, counted, every, meta, "count")
        self.add(fx, "binary", [total, count], {"fn": "div"}, meta)

    def _summed(self, fx: torch.fx.Node, source: str, dims: list[int], meta: TensorMeta, name: str) -> str:
        """`source` summed over `dims` one dim at a time (negative, outermost first), to `meta`."""
        current = source
        for i, d in enumerate(dims):
            shape = list(self.meta(current).shape)
            del shape[len(shape) + d]
            step_meta = TensorMeta(tuple(shape), meta.dtype if i == len(dims) - 1 else self.meta(current).dtype)
            attrs = {"fn": "sum", "dim": d, "keepdim": False}
            current = self.add(fx, "reduce", [current], attrs, step_meta, suffix=f".{name}{i}")
        return current

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
