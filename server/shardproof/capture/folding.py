"""Values computed from literal constants alone, evaluated while capturing.

A causal mask is a constant, however a program writes it: `ones(s, s).triu(1)`,
`tril(ones(s, s)) == 0`, `arange(s)[None] > arange(s)[:, None]`, or the mask torch's own
attention builds. Traced on meta tensors these are chains of different operations with no
values, so the verifier could not see that two programs use the same mask. Every operation whose
tensor inputs are all such constants (factories with literal arguments first) is run here by
torch, on CPU, and its value's digest (dtype, shape and contents) is recorded on the node the
normalizer made for it (`attrs["folded"]`). The encoder states that the node's value is that
constant (`encode.py`), so equal constants are one value whatever operations made them: a fact
of evaluation, sound for any program. A float constant that is 0 or -inf everywhere (an additive
causal mask) also records where it is -inf (`attrs["neg_inf_at"]`): adding it to scores is the
masked_fill of those positions. Only values of at most `MAX_ELEMENTS` elements are
evaluated (a mask of a 1024-token sequence); larger ones keep their structure only.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import torch
import torch.fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..graph.model import Graph

MAX_ELEMENTS = 1 << 20
# ops whose value is not a function of their arguments, or that talk to other ranks
_NOT_FUNCTIONS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential", "empty")
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "_dtensor", "shardproof")


def value_digest(value: torch.Tensor) -> str:
    """A constant's identity: its dtype, shape and contents."""
    flat = value.detach().contiguous().reshape(-1)
    contents = flat.view(torch.uint8) if flat.numel() else flat
    digest = hashlib.sha256(f"{value.dtype!s}|{tuple(value.shape)}|".encode())
    digest.update(contents.cpu().numpy().tobytes())
    return "value:" + digest.hexdigest()[:24]


def masked_positions(value: torch.Tensor) -> str | None:
    """The digest of where an additive mask is -inf, for a float constant that is 0 or -inf
    everywhere (`triu(full(-inf), 1)`, a causal bias): adding it to finite scores is filling
    those positions with -inf (the encoder states so)."""
    if not value.is_floating_point() or value.numel() == 0:
        return None
    negative = value == float("-inf")
    if not bool(negative.any()) or not bool((negative | (value == 0)).all()):
        return None
    return value_digest(negative)


class ConstantFolder:
    """The values of the fx nodes of one program that are computed from constants alone."""

    def __init__(self) -> None:
        self.values: dict[str, torch.Tensor] = {}

    def fold(self, fx: torch.fx.Node) -> torch.Tensor | None:
        """fx's value when torch can compute it from literal arguments and folded values, else None."""
        if fx.op != "call_function" or not isinstance(fx.target, torch._ops.OpOverload):
            return None
        target = fx.target
        if target.namespace in _COLLECTIVE_NAMESPACES or any(word in target.name() for word in _NOT_FUNCTIONS):
            return None
        if getattr(target._schema, "is_mutable", False):
            return None
        expected = fx.meta.get("val")
        if not isinstance(expected, torch.Tensor) or expected.numel() > MAX_ELEMENTS:
            return None
        flat, spec = tree_flatten((list(fx.args), dict(fx.kwargs)))
        for position, argument in enumerate(flat):
            if isinstance(argument, torch.fx.Node):
                known = self.values.get(argument.name)
                if known is None:
                    return None
                flat[position] = known
            elif isinstance(argument, torch.device):
                flat[position] = torch.device("cpu")
        args, kwargs = tree_unflatten(flat, spec)
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                value = target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op that does not run on these values is not folded
            return None
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(expected.shape):
            return None
        if value.dtype != expected.dtype:
            return None
        self.values[fx.name] = value
        return value


class LiteralValues(TorchFunctionMode):
    """The values of the tensors a forward makes from Python data (`torch.tensor([...])`: ALiBi's
    slopes) while it is traced on the meta device, where they would have none. Export lifts such
    a tensor as a constant (the same object): `of(program)` gives the lifted constants' values."""

    def __init__(self) -> None:
        super().__init__()
        self._made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (traced tensor, its value)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        made = func(*args, **kwargs)
        if func in _FROM_DATA and "device" not in kwargs and isinstance(made, torch.Tensor):
            flat, _ = tree_flatten((args, kwargs))
            if not any(isinstance(a, torch.Tensor) for a in flat) and made.numel() <= MAX_ELEMENTS:
                try:
                    with _disable_current_modes(), warnings.catch_warnings():  # not traced: a value
                        warnings.simplefilter("ignore")
                        value = func(*args, **{**kwargs, "device": "cpu"})
                except Exception:  # noqa: BLE001 - a value it cannot make is not known
                    return made
                self._made[id(made)] = (made, value)
        return made

    def of(self, program: Any) -> dict[str, torch.Tensor]:
        constants = getattr(program, "constants", {})
        return {name: self._made[id(t)][1] for name, t in constants.items() if id(t) in self._made}


_FROM_DATA = (torch.tensor, torch.as_tensor)


class ListedIndices(TorchFunctionMode):
    """`x[..., [-2], :]` indexed with the list made a CPU tensor first: the same operation (a list
    of ints indexes as the tensor of its ints), whose index export then lifts with its value.
    Left as a list, torch makes the index tensor inside the call on x's device, where capture
    (the meta device) gives it no value, and nothing could tell which positions are read."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _INDEXING and len(args) >= 2 and not _is_dtensor(args[0]):
            args = (args[0], _listed(args[1]), *args[2:])
        return func(*args, **kwargs)


_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


def _is_dtensor(value: Any) -> bool:
    return type(value).__name__ == "DTensor"


def _listed(index: Any) -> Any:
    if isinstance(index, tuple):
        return tuple(_listed(part) for part in index)
    if isinstance(index, list) and _ints_only(index):
        return torch.tensor(index, device="cpu")
    return index


def _ints_only(values: list[Any]) -> bool:
    """A non-empty (nested) list of ints, not bools (a list of bools indexes as a mask)."""
    return bool(values) and all(
        _ints_only(v) if isinstance(v, list) else isinstance(v, int) and not isinstance(v, bool) for v in values
    )


# the largest constant kept with its graph for verify/constant_blocks.py (a 256-token mask)
MAX_KEPT = 1 << 16


def frontier_constants(graph: Graph, folded: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The folded values an operation on other values reads, or the program returns (the masks
    and biases as the computation sees them, not the steps that made them), small ones only."""
    read = {value for node in graph.nodes if "folded" not in node.attrs for value in node.inputs}
    read.update(graph.outputs)
    return {value: folded[value] for value in read if value in folded and folded[value].numel() <= MAX_KEPT}


__all__ = [
    "MAX_ELEMENTS",
    "MAX_KEPT",
    "ConstantFolder",
    "LiteralValues",
    "frontier_constants",
    "masked_positions",
    "value_digest",
]
