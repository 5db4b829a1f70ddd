"""A reader for the egglog s-expressions of the rule library (rules.py): enough to read it back."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Sym:
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Str:
    text: str

    def __repr__(self) -> str:
        return json.dumps(self.text)


Sexpr = int | Sym | Str | tuple  # a tuple is a list form: (head, *args)

_TOKEN = re.compile(r'\s*(?:(\()|(\))|("(?:[^"\\]|\\.)*")|([^\s()"]+))')


def read_all(text: str) -> list[Sexpr]:
    forms: list[Sexpr] = []
    stack: list[list[Sexpr]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"cannot read {text[position : position + 20]!r}")
        position = match.end()
        opening, closing, string, atom = match.groups()
        if opening:
            stack.append([])
            continue
        if closing:
            if not stack:
                raise ValueError("unbalanced ')'")
            form: Sexpr = tuple(stack.pop())
        elif string is not None:
            form = Str(json.loads(string))
        else:
            assert atom is not None
            form = int(atom) if re.fullmatch(r"-?\d+", atom) else Sym(atom)
        if stack:
            stack[-1].append(form)
        else:
            forms.append(form)
    if stack:
        raise ValueError("unbalanced '('")
    return forms


def read(text: str) -> Sexpr:
    (form,) = read_all(text)
    return form


def head(form: Sexpr) -> str | None:
    if isinstance(form, tuple) and form and isinstance(form[0], Sym):
        return form[0].name
    return None


def symbols(form: Sexpr) -> set[str]:
    """Variables of a form: symbols outside head position."""
    if isinstance(form, Sym):
        return {form.name}
    if isinstance(form, tuple):
        found: set[str] = set()
        for part in form[1:] if head(form) else form:
            found |= symbols(part)
        return found
    return set()
