"""Arithmetic of the normalizer: binary operations (a number operand, a 0-dim constant made in
the forward read as its number), products with a mask written as the masking fill, and complex
numbers written in real terms."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..graph.model import TensorMeta
from .lowering_tables import _REAL_OF_COMPLEX, _literal


class ArithmeticLowering:
    """Lowerings of the normalizer (`normalize._Builder`): its binary operations and complex
    values."""

    def scalar_or_value(self, arg: Any) -> tuple[str | None, Any]:
        if isinstance(arg, torch.fx.Node):
            number = self.scalar_constants.get(self.alias.get(arg.name, arg.name))
            if number is not None:
                return None, number
            return self.value(arg), None
        return None, _literal(arg)

    def _note_constant(self, name: str, target: str) -> None:
        """A 0-dim tensor made in the forward from a number (`h * torch.tensor(d ** 0.5)`, Gemma's
        normalizer): export lifts it with its value. An operation with it is the operation with
        that number (type promotion treats a 0-dim tensor like a number), so it is written as one."""
        value = getattr(self.program, "constants", {}).get(target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.device.type == "meta":
            return
        if not value.is_complex() and value.dtype != torch.bool:
            self.scalar_constants[name] = _literal(value.item())

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
        if fn == "mul" and left_id is not None and right_id is not None and self.masked(fx, left_id, right_id, meta):
            return
        if left_id is not None and right_id is not None:
            node_id = self.add(fx, "binary", [left_id, right_id], {"fn": fn}, meta)
            if fn == "mul" and meta.dtype.startswith("complex"):
                self.complex_product(fx, node_id, left_id, right_id, meta)
        elif left_id is not None:
            self.add(fx, "scalar", [left_id], {"fn": fn, "value": right_scalar}, meta)
        elif right_id is not None:
            self.add(fx, "scalar", [right_id], {"fn": f"r{fn}", "value": left_scalar}, meta)

    def masked(self, fx: torch.fx.Node, left: str, right: str, meta: TensorMeta) -> bool:
        """x * mask with a boolean mask is x where the mask holds and 0 elsewhere: written as the
        fill of the mask's negation with 0, the one form of masking the rules know (masked_fill,
        where). Only when x already has the product's shape and type (the mask broadcasts). A mask
        cast to a number type first (`mask.to(x.dtype)`, 1 where it holds and 0 elsewhere) is that
        mask."""
        for value, mask in ((left, right), (right, left)):
            mask = self._bool_before_cast(mask)
            value_meta, mask_meta = self.meta(value), self.meta(mask)
            if mask_meta.dtype != "bool" or value_meta.dtype == "bool":
                continue
            if value_meta.shape != meta.shape or value_meta.dtype != meta.dtype:
                continue
            negated = self._without_negation(fx, mask) or self._negation(fx, mask)
            self.add(fx, "fill", [value, negated], {"value": 0.0}, meta)
            return True
        return False

    def _negation(self, fx: torch.fx.Node, mask: str) -> str:
        """A node for the negation of a boolean mask, folded like any constant when the mask is one
        (a causal mask stays comparable to the reference's, folding.py)."""
        negated = self.add(fx, "unary", [mask], {"fn": "logical_not"}, self.meta(mask), suffix=".unmasked")
        value = self.folded.get(mask)
        if value is not None:
            self.note_folded(negated, torch.logical_not(value))
        return negated

    def _without_negation(self, fx: torch.fx.Node, mask: str) -> str | None:
        """The mask's negation without a double negation, when the mask is the negation of a
        boolean (`x * ~outside`), or a view of one (`x * (~outside)[..., None]`): the negated
        boolean itself, viewed alike. Else None."""
        node = self.nodes_by_id.get(mask)
        view = None
        if node is not None and node.op == "view":
            view, node = node, self.nodes_by_id.get(node.inputs[0])
        negations = ("logical_not", "bitwise_not")
        if node is None or node.op != "unary" or node.attrs.get("fn") not in negations:
            return None
        source = node.inputs[0]
        if self.meta(source).dtype != "bool":
            return None
        if view is None:
            return source
        return self.add(fx, "view", [source], dict(view.attrs), view.meta, suffix=".unnegated")

    def _bool_before_cast(self, value: str) -> str:
        """The boolean a value was cast from (true is 1, false is 0), else the value itself."""
        node = self.nodes_by_id.get(value)
        if node is not None and node.op == "unary" and str(node.attrs.get("fn", "")).startswith("cast_"):
            source = node.inputs[0]
            if self.meta(source).dtype == "bool":
                return source
        return value

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
