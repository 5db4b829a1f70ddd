"""Where the numbers that shape shards come from.

A shard's offset, size or head index is a Python number the builder computes from the rank and
the world size, often in a helper far from the slice that uses it (`kv = kv_head_for_rank(rank,
...)`, `start, end = vocab_range(vocab, rank, world_size)`). When the shard is wrong, the fix is
where the number was computed, not where it was used, so capture records both:

- the builder receives the rank and the world size (and `dist.get_rank()` / `get_world_size()`
  answer) as `TracedInt`s: ints in every respect, whose arithmetic returns traced numbers that
  remember the operation, its operands and the user line (with columns) that computed them;
- a torch function mode records every torch call that receives a traced number (a slice bound of
  `W[a:b]`, `narrow`'s start and length, a chunk count) as a `NumberUse` at the calling line.

The localizer replays these derivations with other values to find the line whose number, changed
alone, would make the shards right (localize/number_origin.py). Tracing stops when a number leaves
Python arithmetic (`int(x)`, a numpy value) and the built module's attributes are turned back into
plain numbers before the forward is captured.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import linecache
import math
import operator
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..graph.model import Frame
from ..graph.numbers import AttributeNumber, Bound, NumberStep, NumberUse
from .frames import _frame_positions, is_user_file, library_of

# -- traced numbers ------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, TracedInt):
        return int.__int__(value)
    if isinstance(value, TracedFloat):
        return float.__float__(value)
    return value


def _operand(value: Any) -> NumberStep | int | float:
    if isinstance(value, TracedInt | TracedFloat):
        return value.step
    return _plain(value)


def _traced(result: Any, op: str, operands: tuple[Any, ...]) -> Any:
    if isinstance(result, bool) or not isinstance(result, int | float):
        return result
    step = NumberStep(result, op, tuple(_operand(o) for o in operands), user_frame())
    return TracedInt(result, step) if isinstance(result, int) else TracedFloat(result, step)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _binary(op: str, fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[[Any, Any], Any]:
    def method(self: Any, other: Any) -> Any:
        if not _is_number(other):
            return NotImplemented
        left, right = (other, self) if reflected else (self, other)
        return _traced(fn(_plain(left), _plain(right)), op, (left, right))

    return method


def _unary(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any) -> Any:
        return _traced(fn(_plain(self), *args), op, (self,))

    return method


_BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}
_DUNDERS = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "**": "pow"}


def _with_arithmetic(cls: type) -> type:
    for op, fn in _BINARY.items():
        name = _DUNDERS[op]
        setattr(cls, f"__{name}__", _binary(op, fn))
        setattr(cls, f"__r{name}__", _binary(op, fn, reflected=True))
    cls.__neg__ = _unary("neg", operator.neg)
    cls.__pos__ = _unary("pos", operator.pos)
    cls.__abs__ = _unary("abs", abs)
    cls.__floor__ = _unary("floor", math.floor)
    cls.__ceil__ = _unary("ceil", math.ceil)
    cls.__trunc__ = _unary("trunc", math.trunc)
    cls.__round__ = _unary("round", round)
    return cls


@_with_arithmetic
class TracedInt(int):
    """An int that remembers how it was computed (its `step`)."""

    step: NumberStep

    def __new__(cls, value: int, step: NumberStep) -> TracedInt:
        obj = int.__new__(cls, value)
        obj.step = step
        return obj

    def __reduce__(self) -> Any:
        return (int, (int.__int__(self),))  # pickled (to a witness process) as the plain number


@_with_arithmetic
class TracedFloat(float):
    """A float that remembers how it was computed (its `step`)."""

    step: NumberStep

    def __new__(cls, value: float, step: NumberStep) -> TracedFloat:
        obj = float.__new__(cls, value)
        obj.step = step
        return obj

    def __reduce__(self) -> Any:
        return (float, (float.__float__(self),))


def origin(value: int, what: str) -> TracedInt:
    return TracedInt(value, NumberStep(value, what))


# -- the user line of a computation -------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _is_users(filename: str) -> bool:
    return is_user_file(filename) and library_of(filename) is None


def user_frame(skip: int = 1) -> Frame | None:
    """The innermost frame of the user's own code on the current stack (the line that computed a
    number, or called torch with it), with the columns of the executing expression."""
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        if _is_users(frame.f_code.co_filename):
            return _frame_of(frame)
        frame = frame.f_back
    return None


def _frame_of(frame: FrameType) -> Frame:
    filename = frame.f_code.co_filename
    line, end_line, column, end_column = _frame_positions(frame)
    code = linecache.getline(filename, line).strip()
    return Frame(filename, line, frame.f_code.co_name, code, column, end_line, end_column)


# -- min / max / sqrt keep the trace ------------------------------------------------------------

_BUILTIN_MIN, _BUILTIN_MAX, _MATH_SQRT = builtins.min, builtins.max, math.sqrt


def _extremum(name: str, builtin: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        if kwargs or not args:
            return builtin(*args, **kwargs)
        items = list(args[0]) if len(args) == 1 and not _is_number(args[0]) else list(args)
        result = builtin(items)
        if not any(isinstance(i, TracedInt | TracedFloat) for i in items) or not all(_is_number(i) for i in items):
            return result
        return _traced(_plain(result), name, tuple(items))

    return traced


def _sqrt(value: Any) -> Any:
    result = _MATH_SQRT(value)
    return _traced(result, "sqrt", (value,)) if isinstance(value, TracedInt | TracedFloat) else result


@contextlib.contextmanager
def _traced_builtins() -> Iterator[None]:
    builtins.min, builtins.max = _extremum("min", _BUILTIN_MIN), _extremum("max", _BUILTIN_MAX)
    math.sqrt = _sqrt
    try:
        yield
    finally:
        builtins.min, builtins.max, math.sqrt = _BUILTIN_MIN, _BUILTIN_MAX, _MATH_SQRT


# -- where torch receives traced numbers ---------------------------------------------------------


def _traced_roles(function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, NumberStep]]:
    roles: list[tuple[str, NumberStep]] = []
    if function == "__getitem__" and len(args) == 2:
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
        for position, part in enumerate(key):
            if isinstance(part, slice):
                for what in ("start", "stop", "step"):
                    value = getattr(part, what)
                    if isinstance(value, TracedInt):
                        roles.append((f"dim {position} {what}", value.step))
            elif isinstance(part, TracedInt):
                roles.append((f"dim {position} index", part.step))
        return roles
    names = _PARAMETERS.get(function, ()) if args and isinstance(args[0], torch.Tensor) else ()
    for position, value in enumerate(args):
        role = names[position - 1] if 0 < position <= len(names) else f"arg {position}"
        roles.extend(_numbers_in(role, value))
    for name, value in kwargs.items():
        roles.extend(_numbers_in(name, value))
    return roles


def _numbers_in(role: str, value: Any) -> list[tuple[str, NumberStep]]:
    if isinstance(value, TracedInt | TracedFloat):
        return [(role, value.step)]
    if isinstance(value, list | tuple):
        return [(f"{role} {i}", v.step) for i, v in enumerate(value) if isinstance(v, TracedInt | TracedFloat)]
    return []


# The positional parameters (after the tensor) of the calls that cut a tensor.
_PARAMETERS = {
    "narrow": ("dim", "start", "length"),
    "chunk": ("chunks", "dim"),
    "split": ("split_size", "dim"),
    "tensor_split": ("sections", "dim"),
    "select": ("dim", "index"),
}


class NumberUses(TorchFunctionMode):
    """Records the torch calls that receive traced numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.uses: list[NumberUse] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        with contextlib.suppress(Exception):  # recording is best effort; the call itself must run
            self._record(func, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        function = getattr(func, "__name__", str(func))
        roles = _traced_roles(function, args, kwargs)
        if not roles:
            return
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        dim, cut = _cut(function, args, kwargs)
        self.uses.append(
            NumberUse(
                function=function.strip("_"),
                frame=user_frame(),
                roles=tuple(roles),
                shape=tuple(tensor.shape) if tensor is not None else (),
                dim=dim,
                cut=cut,
            )
        )


def _bound(value: Any) -> Bound:
    if isinstance(value, TracedInt):
        return value.step
    return None if value is None else int(_plain(value))


def _cut(function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | None, Any]:
    """The one block of one dim the call cuts, when it is that simple: `W[a:b]`, `W[:, a:b]`
    (slices and plain indices only, one slice with a traced bound, step 1) or `narrow`."""
    if function == "__getitem__" and len(args) == 2 and not kwargs:
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
        if not all(isinstance(p, slice) or (isinstance(p, int) and not isinstance(p, bool)) for p in key):
            return None, None
        traced = [
            i
            for i, p in enumerate(key)
            if isinstance(p, slice) and any(isinstance(b, TracedInt) for b in (p.start, p.stop))
        ]
        if len(traced) != 1 or key[traced[0]].step not in (None, 1):
            return None, None
        part = key[traced[0]]
        return traced[0], ("slice", _bound(part.start), _bound(part.stop))
    if function == "narrow":
        values = list(args[1:4]) + [kwargs.get(k) for k in ("dim", "start", "length")[len(args) - 1 :]]
        if len(values) >= 3 and all(isinstance(v, int) for v in values[:3]):
            return int(_plain(values[0])), ("narrow", _bound(values[1]), _bound(values[2]))
    return None, None


# -- the builder's run ---------------------------------------------------------------------------


@contextlib.contextmanager
def tracing_numbers(rank: int, world_size: int) -> Iterator[tuple[TracedInt, TracedInt, NumberUses]]:
    """While a parallel builder runs: the traced rank and world size to pass it, `dist.get_rank()`
    and `get_world_size()` answering traced numbers, and the record of their uses."""
    import torch.distributed as dist

    traced_rank, traced_world = origin(rank, "rank"), origin(world_size, "world size")
    get_rank, get_world_size = dist.get_rank, dist.get_world_size

    def traced_get_rank(group: Any = None) -> int:
        value = get_rank(group)
        return traced_rank if group is None and value == rank else value

    def traced_get_world_size(group: Any = None) -> int:
        value = get_world_size(group)
        return traced_world if group is None and value == world_size else value

    uses = NumberUses()
    dist.get_rank, dist.get_world_size = traced_get_rank, traced_get_world_size
    try:
        with _traced_builtins(), _module_list_cuts(uses.uses), uses:
            yield traced_rank, traced_world, uses
    finally:
        dist.get_rank, dist.get_world_size = get_rank, get_world_size


@contextlib.contextmanager
def _module_list_cuts(into: list[NumberUse]) -> Iterator[None]:
    """A builder that takes its experts or layers as `ref.experts[first : first + n]` cuts a module
    list, not a tensor: those cuts are recorded too (dim 0 of the list's length)."""
    containers = (torch.nn.ModuleList, torch.nn.Sequential)
    originals = {cls: cls.__getitem__ for cls in containers}

    def recording(original: Callable[..., Any]) -> Callable[..., Any]:
        def getitem(self: Any, index: Any) -> Any:
            roles = []
            if isinstance(index, slice) and index.step in (None, 1):
                bounds = {"start": index.start, "stop": index.stop}
                roles = [(f"dim 0 {w}", b.step) for w, b in bounds.items() if isinstance(b, TracedInt)]
            if roles:
                into.append(
                    NumberUse(
                        function="module list getitem",
                        frame=user_frame(),
                        roles=tuple(roles),
                        shape=(len(self),),
                        dim=0,
                        cut=("slice", _bound(index.start), _bound(index.stop)),
                    )
                )
            return original(self, index)

        return getitem

    for cls, original in originals.items():
        cls.__getitem__ = recording(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__getitem__ = original  # type: ignore[method-assign]


def plain_attributes(module: torch.nn.Module) -> list[AttributeNumber]:
    """Turn the traced numbers a built module keeps (`self.start = start`) into plain ones, so the
    forward is captured exactly as it would run; the numbers kept directly as attributes are
    returned with their derivations."""
    kept: dict[tuple[str, str, str], AttributeNumber] = {}
    for sub in module.modules():
        cls = type(sub)
        file = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
        for name, value in list(vars(sub).items()):
            if isinstance(value, TracedInt | TracedFloat) and _is_users(file):
                key = (file, cls.__qualname__, name)
                kept.setdefault(key, AttributeNumber(*key, value.step))
            plain = _plain_deep(value)
            if plain is not value:
                object.__setattr__(sub, name, plain)
    return list(kept.values())


def _plain_deep(value: Any, depth: int = 0) -> Any:
    if isinstance(value, TracedInt | TracedFloat):
        return _plain(value)
    if depth > 3:
        return value
    if type(value) is list:
        value[:] = [_plain_deep(v, depth + 1) for v in value]  # in place: others may hold the list
    elif type(value) is dict:
        for key, item in list(value.items()):
            value[key] = _plain_deep(item, depth + 1)
    elif type(value) is tuple:
        items = tuple(_plain_deep(v, depth + 1) for v in value)
        if any(a is not b for a, b in zip(items, value, strict=True)):
            return items
    return value
