"""The numbers a parallel builder computed from the rank and the world size, and the torch calls
that received them (recorded by capture/numbers.py; read by localize/number_origin.py).
Torch-free and picklable: ranks captured in other processes send them back."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .model import Frame

_ORDER = itertools.count()


@dataclass(frozen=True, eq=False)
class NumberStep:
    """One number and how it was computed: `op` of `operands` (steps or plain numbers) at `frame`.
    The origins are the rank and the world size (op "rank" / "world size", no operands); a plain
    number the user's code computed without them (a helper's return, a literal) is op "number"."""

    value: int | float
    op: str
    operands: tuple[NumberStep | int | float, ...] = ()
    frame: Frame | None = None
    order: int = field(default_factory=lambda: next(_ORDER))  # creation order within the process

    @property
    def is_origin(self) -> bool:
        """The rank or the world size: what the builder is given, never what it computed."""
        return self.op in ("rank", "world size")

    def ancestors(self) -> list[NumberStep]:
        """Every step this one was computed from, itself included, each once."""
        seen: dict[int, NumberStep] = {}
        stack = [self]
        while stack:
            step = stack.pop()
            if id(step) in seen:
                continue
            seen[id(step)] = step
            stack.extend(o for o in step.operands if isinstance(o, NumberStep))
        return list(seen.values())

    def reads_rank(self) -> bool:
        return any(s.op == "rank" for s in self.ancestors())


Bound = NumberStep | int | None


@dataclass(frozen=True)
class NumberUse:
    """A torch call at a user line that received traced numbers: `roles` maps what each number
    is to the call ("dim 0 start", "dim 0 stop", "start", "length", "chunks", "arg 1") to its step.
    `shape` is the shape of the tensor the call reads. A call that cuts one block out of one dim
    (`W[a:b]`, `W[:, a:b]`, `W.narrow(d, a, n)`) also keeps the cut: its `dim` and `cut`, either
    ("slice", start, stop) or ("narrow", start, length), each a step or a plain number."""

    function: str
    frame: Frame | None
    roles: tuple[tuple[str, NumberStep], ...]
    shape: tuple[int, ...] = ()
    dim: int | None = None
    cut: tuple[str, Bound, Bound] | None = None

    def step(self, role: str) -> NumberStep | None:
        return next((s for r, s in self.roles if r == role), None)


@dataclass(frozen=True)
class AttributeNumber:
    """A traced number the built module keeps as an attribute (`self.scale = head_dim ** -0.5`),
    by the class that holds it: the forward reads it as a plain constant."""

    file: str  # where the class is defined
    cls: str
    attribute: str
    step: NumberStep


@dataclass
class BuilderNumbers:
    """What one rank's builder did with the numbers it computed from the rank and the world size:
    the torch calls that received them, and the attributes the built module keeps."""

    uses: list[NumberUse] = field(default_factory=list)
    attributes: list[AttributeNumber] = field(default_factory=list)

    def attribute(self, file: str, cls: str, attribute: str) -> NumberStep | None:
        return next((a.step for a in self.attributes if (a.file, a.cls, a.attribute) == (file, cls, attribute)), None)
