"""Contractions: linear, mm, bmm / baddbmm (a batch merged from two dims kept as both), addmm,
and two-operand einsum written as the permutes, views and one matmul it computes."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from ..graph.model import TensorMeta
from .lowering_tables import _einsum_plan, _literal


class ContractionLowering:
    """Lowerings of the normalizer (`normalize._Builder`), by the op they handle (`op_<name>`)."""

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
