"""What the terms and relations of the egglog language (verify/language.py) mean, in torch.

This is the reference semantics the rule checks hold every rule to. It is written from the
documented meaning of each constructor and relation, independently of the rules: a rule that
does not follow from these meanings fails its check.

Numbers are real numbers computed in float64. Casts to a floating dtype are the identity (the
verifier reasons about the real-number function, rounding aside); casts to an integer or boolean
dtype really truncate.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .sexpr import Str, Sym, head

TOLERANCE = {"rtol": 1e-9, "atol": 1e-12}


class Undefined(Exception):
    """The value does not exist: an out-of-range slice, an unaligned range division, bad shapes."""


class Unbound(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class MultiSet(list):
    """The multiset of an all-reduce's inputs (order is irrelevant to its sum)."""


# -- range lists --------------------------------------------------------------------------------
RANGE_CONSTRUCTORS = {"RNil", "RCons", "RApp", "RShift", "RSub", "RClip", "RDiv", "RMul", "RCompose", "RTile", "RUnion"}


def range_list(ranges: list[tuple[int, int]]) -> tuple:
    """The plain list term for ranges [(s, e), ...]."""
    term: tuple = ("RNil",)
    for start, end in reversed(ranges):
        term = ("RCons", start, end, term)
    return term


def is_plain(term: tuple) -> bool:
    while term[0] == "RCons":
        term = term[3]
    return term[0] == "RNil"


def indices(term: tuple) -> list[int]:
    """The index sequence a range-list term selects; Undefined where an operation's precondition fails."""
    kind = term[0]
    if kind == "RNil":
        return []
    if kind == "RCons":
        _, start, end, rest = term
        if not 0 <= start <= end:
            raise Undefined(f"range [{start}, {end}) is not a range")
        return list(range(start, end)) + indices(rest)
    if kind == "RApp":
        return indices(term[1]) + indices(term[2])
    if kind == "RShift":
        return [i + term[2] for i in indices(term[1])]
    if kind == "RSub":  # positions [a, b) of the selection
        selected, a, b = indices(term[1]), term[2], term[3]
        if not 0 <= a <= b <= len(selected):
            raise Undefined(f"positions [{a}, {b}) of a selection of {len(selected)}")
        return selected[a:b]
    if kind == "RClip":  # a selection inside [a, b), re-based to a
        selected, a, b = indices(term[1]), term[2], term[3]
        if any(not a <= i < b for i in selected):
            raise Undefined(f"a selection reaching outside [{a}, {b})")
        return [i - a for i in selected]
    if kind == "RDiv":  # whole blocks of k, seen as block indices
        selected, k = indices(term[1]), term[2]
        if k <= 0 or len(selected) % k:
            raise Undefined(f"a selection of {len(selected)} is not whole blocks of {k}")
        blocks = []
        for j in range(0, len(selected), k):
            block = selected[j : j + k]
            if block[0] % k or block != list(range(block[0], block[0] + k)):
                raise Undefined(f"a selection not aligned to blocks of {k}")
            blocks.append(block[0] // k)
        return blocks
    if kind == "RMul":  # block indices, seen as the elements of blocks of k
        return [i * term[2] + j for i in indices(term[1]) for j in range(term[2])]
    if kind == "RCompose":  # positions t of the selection r
        selected, positions = indices(term[1]), indices(term[2])
        if any(p >= len(selected) for p in positions):
            raise Undefined("positions past the end of a selection")
        return [selected[p] for p in positions]
    if kind == "RTile":  # m copies of the selection, the i-th shifted by i * h
        selected, h, m = indices(term[1]), term[2], term[3]
        if m < 0:
            raise Undefined(f"{m} copies")
        return [i + copy * h for copy in range(m) for i in selected]
    if kind == "RUnion":  # the merge of two ascending, disjoint selections
        left, right = indices(term[1]), indices(term[2])
        if not ascending(left) or not ascending(right) or set(left) & set(right):
            raise Undefined("a merge of selections that are not ascending and disjoint")
        return sorted(left + right)
    raise ValueError(f"not a range list: {term!r}")


def ascending(selected: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(selected))


# -- tensor ops ------------------------------------------------------------------------------------
def _unary(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name.startswith("cast_"):
        dtype = getattr(torch, name.removeprefix("cast_"))
        if dtype.is_floating_point or dtype.is_complex:
            return lambda x: x
        return lambda x: x.to(dtype)
    special = {
        "square": lambda x: x * x,
        "logical_not": torch.logical_not,
        "bitwise_not": torch.bitwise_not,
        "hardtanh": F.hardtanh,
        "softplus": F.softplus,
        "gelu": F.gelu,
        "mish": F.mish,
        "elu": F.elu,
        "leaky_relu": F.leaky_relu,
        "relu6": F.relu6,
        "hardsigmoid": F.hardsigmoid,
        "hardswish": F.hardswish,
        "silu": F.silu,
    }
    if name in special:
        return special[name]
    return getattr(torch, name)


def _logical(name: str) -> Callable[[Any, Any], torch.Tensor]:
    def apply(a: Any, b: Any) -> torch.Tensor:
        both_bool = all(not isinstance(v, torch.Tensor) or v.dtype == torch.bool for v in (a, b))
        return getattr(torch, ("logical_" if both_bool else "bitwise_") + name)(a, b)

    return apply


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "or": _logical("or"),
    "and": _logical("and"),
    "xor": _logical("xor"),
    "remainder": torch.remainder,
    "floor_divide": torch.floor_divide,
    "atan2": torch.atan2,
    "fmod": torch.fmod,
    "rsub": lambda a, b: torch.sub(b, a),
}


def _as_tensor(value: Any) -> torch.Tensor:
    """Scalar operands as 0-d tensors, so that `value op x` works for every op (torch.lt(2.0, x) does not)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)


def binary(name: str, a: Any, b: Any) -> torch.Tensor:
    a, b = (_as_tensor(v) for v in (a, b))
    if name in _BINARY:
        return _BINARY[name](a, b)
    if name.startswith("r") and name[1:] in _BINARY:  # value op x, written x rop value
        return _BINARY[name[1:]](b, a)
    raise Undefined(f"unknown binary op {name}")


_REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "sum": torch.sum,
    "mean": torch.mean,
    "amax": torch.amax,
    "amin": torch.amin,
    "prod": lambda x, dim, keepdim: torch.prod(x, dim=dim, keepdim=keepdim),
    "logsumexp": torch.logsumexp,
    "argmax": lambda x, dim, keepdim: torch.argmax(x, dim=dim, keepdim=keepdim),
    "argmin": lambda x, dim, keepdim: torch.argmin(x, dim=dim, keepdim=keepdim),
    "all": lambda x, dim, keepdim: torch.all(x, dim=dim, keepdim=keepdim),
    "any": lambda x, dim, keepdim: torch.any(x, dim=dim, keepdim=keepdim),
}


def _shape(text: str) -> list[int]:
    return [int(s) for s in text.split(",")] if text else []


def _checked_dim(t: torch.Tensor, dim: int) -> int:
    if not -t.dim() <= dim < 0:
        raise Undefined(f"dim {dim} of a {t.dim()}-d tensor")
    return dim


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, attrs: str) -> torch.Tensor:
    options = json.loads(attrs)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=bool(options.get("is_causal")),
        scale=options.get("scale"),
        enable_gqa=bool(options.get("enable_gqa")),
    )


def _pick(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """x.gather(d, i.unsqueeze(d)).squeeze(d): row by row, the entry i names along d."""
    dim = _checked_dim(x, dim)
    if index.dim() != x.dim() - 1 or index.dtype.is_floating_point:
        raise Undefined("a pick needs integer indices with one entry per row")
    if index.numel() and (index.min() < 0 or index.max() >= x.shape[dim]):
        raise Undefined(f"an index outside a dim of {x.shape[dim]}")
    return x.gather(dim, index.long().unsqueeze(dim)).squeeze(dim)


def narrow_range(x: torch.Tensor, dim: int, start: int, end: int) -> torch.Tensor:
    dim = _checked_dim(x, dim)
    if not 0 <= start <= end <= x.shape[dim]:
        raise Undefined(f"slice [{start}, {end}) of a dim of {x.shape[dim]}")
    return x.narrow(dim, start, end - start)


def _along(key: str, x: torch.Tensor, d: int, args: str) -> torch.Tensor:
    """`(Along "fn#index" x d args)`: topk (values or indices), sort or a cumulative op along d."""
    import json

    fn, _, index = key.partition("#")
    literal = json.loads(args)
    d = _checked_dim(x, d)
    if fn == "topk":
        return torch.topk(x, int(literal[0]), dim=d)[int(index or 0)]
    if fn == "sort":
        return torch.sort(x, dim=d)[int(index or 0)]
    if fn in ("cumsum", "cumprod"):
        return getattr(torch, fn)(x, dim=d)
    if fn in ("cummax", "cummin"):
        return getattr(torch, fn)(x, dim=d)[int(index or 0)]
    raise Undefined(f"unknown op along a dim {fn}")


TENSOR_CONSTRUCTORS: dict[str, Callable[..., Any]] = {
    "Slice": narrow_range,
    "Cat": lambda a, b, d: torch.cat([a, b], _checked_dim(a, d)),
    "View": lambda x, shape: x.reshape(_shape(shape)),
    "Permute": lambda x, perm: x.permute(_shape(perm)),
    "Expand": lambda x, shape: x.expand(_shape(shape)),
    "Rep": lambda x, d, m: torch.repeat_interleave(x, m, dim=_checked_dim(x, d)),
    "Un": lambda f, x: _unary(f)(x),
    "Sc": lambda f, x, c: binary(f, x, float(c)),
    "ScI": lambda f, x, c: binary(f, x, c),
    "Bin": binary,
    "Where": lambda c, a, b: torch.where(c.bool(), a, b),
    "Fill": lambda x, m, v: x.masked_fill(m.bool(), float(v)),
    "Red": lambda f, x, d, k: _REDUCTIONS[f](x, dim=_checked_dim(x, d), keepdim=bool(k)),
    "Softmax": lambda x, d: torch.softmax(x, _checked_dim(x, d)),
    "Along": lambda f, x, d, a: _along(f, x, d, a),
    "LogSoftmax": lambda x, d: torch.log_softmax(x, _checked_dim(x, d)),
    "Linear": F.linear,
    "Matmul": torch.matmul,
    "Emb": lambda w, ids: F.embedding(ids.long(), w),
    "Pick": lambda x, i, d: _pick(x, i, d),
    "Sdpa": lambda q, k, v, at: _sdpa(q, k, v, None, at),
    "SdpaMask": lambda q, k, v, m, at: _sdpa(q, k, v, m, at),
    "SumN": lambda ms: sum(ms[1:], ms[0]),
    "MaxN": lambda ms: torch.stack(list(ms)).amax(0),
    "MinN": lambda ms: torch.stack(list(ms)).amin(0),
    "Op2": lambda key, a, b, args: _generic(key, [a, b], args),
    "Op3": lambda key, a, b, c, args: _generic(key, [a, b, c], args),
}


def _generic(key: str, tensors: list[torch.Tensor], args: str) -> torch.Tensor:
    """`(OpN "target#index" ... args)` for the opaque ops a rule names."""
    import json

    literal = json.loads(args)
    if key == "aten::embedding_dense_backward#0":
        _grad, _ids, num_weights, padding_idx, scale = literal
        return torch.ops.aten.embedding_dense_backward(tensors[0], tensors[1].long(), num_weights, padding_idx, scale)
    if key in ("shardproof::depthwise_convolution#0", "shardproof::convolution#0"):
        stride, padding, dilation = literal
        convolve = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[tensors[0].dim()]
        bias = tensors[2] if len(tensors) > 2 else None
        groups = tensors[0].shape[1] if key.startswith("shardproof::depthwise") else 1
        agree = tensors[1].shape[1] * groups == tensors[0].shape[1]
        if not agree or (bias is not None and bias.shape[0] != tensors[1].shape[0]):
            raise Undefined("a convolution's filters, bias and input channels must agree")
        return convolve(tensors[0], tensors[1], bias, stride, padding, dilation, groups=groups)
    if key == "aten::index_put#0" and literal == ["<tensor>", ["<tensor>"], "<tensor>"]:
        base, index, values = tensors
        if index.dtype.is_floating_point or (index.numel() and (index.min() < 0 or index.max() >= base.shape[0])):
            raise Undefined("index_put needs integer indices inside the base")
        return torch.ops.aten.index_put(base, [index.long()], values)
    raise Undefined(f"no meaning for the opaque op {key}")


_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: int(a / b) if b else _undefined("division by zero"),  # i64: truncating
    "%": lambda a, b: int(math.fmod(a, b)) if b else _undefined("remainder by zero"),
}
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "!=": lambda a, b: not same(a, b),
}


def _undefined(message: str) -> int:
    raise Undefined(message)


@dataclass
class Made:
    """How a tensor was built, for the front-end facts about it (view, permute and expand dim maps)."""

    kind: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    text: str


class Evaluator:
    """Evaluates forms under variable bindings; remembers how views, permutations and expansions were made."""

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self.made: dict[int, Made] = {}
        self._alive: list[Any] = []

    def __call__(self, form: Any) -> Any:
        if isinstance(form, int):
            return form
        if isinstance(form, Str):
            return form.text
        if isinstance(form, Sym):
            if form.name not in self.env:
                raise Unbound(form.name)
            return self.env[form.name]
        name = head(form)
        args = [self(a) for a in form[1:]]
        if name in _INT_OPS:
            return _INT_OPS[name](*args)
        if name == "sz":
            tensor, dim = args
            return tensor.shape[_checked_dim(tensor, dim)]
        if name == "nd":
            return args[0].dim()
        if name in RANGE_CONSTRUCTORS:
            return (name, *args)
        if name == "multiset-of":
            return MultiSet(args)
        if name == "multiset-insert":
            return MultiSet([*args[0], args[1]])
        if name == "multiset-remove":  # one occurrence
            members, gone = list(args[0]), args[1]
            position = next((i for i, m in enumerate(members) if same(m, gone)), None)
            if position is None:
                raise Undefined("multiset-remove: not a member")
            del members[position]
            return MultiSet(members)
        if name in TENSOR_CONSTRUCTORS:
            try:
                value = TENSOR_CONSTRUCTORS[name](*args)
            except (RuntimeError, IndexError, ValueError, TypeError) as exc:
                raise Undefined(f"{name}: {exc}") from exc
            if name in ("View", "Permute", "Expand"):
                self.made[id(value)] = Made(name, tuple(args[0].shape), tuple(value.shape), args[1])
                self._alive.append(value)
            return value
        raise ValueError(f"no meaning for {name}")


def same(a: Any, b: Any) -> bool:
    """Equal values: tensors of one shape equal within the tolerance, range lists selecting the same."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if a.is_floating_point() or b.is_floating_point():
            return torch.allclose(a.double(), b.double(), equal_nan=True, **TOLERANCE)
        return torch.equal(a, b)
    if isinstance(a, tuple) and isinstance(b, tuple) and a and a[0] in RANGE_CONSTRUCTORS:
        try:
            return indices(a) == indices(b)
        except Undefined:
            return False
    return a == b


def select(tensor: torch.Tensor, dim: int, ranges: tuple) -> torch.Tensor:
    """X[..., R, ...]: the ranges of R along dim, concatenated in order."""
    dim = _checked_dim(tensor, dim)
    chosen = indices(ranges)
    if any(i >= tensor.shape[dim] for i in chosen):
        raise Undefined(f"a selection past the end of a dim of {tensor.shape[dim]}")
    return tensor.index_select(dim, torch.tensor(chosen, dtype=torch.long))


def outside(ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
    return (ids < start) | (ids >= end)
