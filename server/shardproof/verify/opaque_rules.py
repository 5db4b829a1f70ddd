"""Which operations the rule library matches as opaque calls (`(Op2 "aten::embedding_dense_backward"
...)`), and in which forms: the normalizer keeps such operations whole instead of writing out
their decomposition (capture/decompose.py), and laws are derived for the calls no hand-written rule
matches (op_laws.py)."""

from __future__ import annotations

import re

from .rules import all_rules


def opaque_ops() -> frozenset[str]:
    """The operations rules match as opaque calls (`(Op2 "aten::embedding_dense_backward" ...)`): the
    normalizer keeps them whole instead of writing out their decomposition."""
    return frozenset(re.findall(r'\(Op\d "([^"#]+)', "\n".join(rule.text for rule in all_rules())))


def opaque_forms() -> dict[str, frozenset[str] | None]:
    """For each operation rules match as an opaque call, the quoted literal arguments (its `attrs`
    term) those rules require, or None when a rule takes any: a call in another form is one no
    hand-written rule matches (op_laws.py derives laws for it)."""
    forms: dict[str, set[str] | None] = {}
    call = re.compile(r'\(Op(\d) "([^"#]+)#\d+"')
    for rule in all_rules():
        text = rule.text
        for found in call.finditer(text):
            target = found.group(2)
            attrs = _attrs_after(text, found.end(), int(found.group(1)))
            known = forms.setdefault(target, set())
            if attrs is None or known is None:
                forms[target] = None
            else:
                known.add(attrs)
    return {target: None if attrs is None else frozenset(attrs) for target, attrs in forms.items()}


def _attrs_after(text: str, position: int, operands: int) -> str | None:
    """The literal argument term after an opaque call's operands (a quoted string), or None when
    the rule names it by a variable."""
    tokens = 0
    while tokens <= operands:
        while text[position] == " ":
            position += 1
        start = position
        if text[position] == "(":
            depth = 0
            while True:
                depth += {"(": 1, ")": -1}.get(text[position], 0)
                position += 1
                if depth == 0:
                    break
        elif text[position] == '"':
            position += 1
            while text[position] != '"':
                position += 2 if text[position] == "\\" else 1
            position += 1
        else:
            while text[position] not in " )":
                position += 1
        tokens += 1
        if tokens > operands:
            token = text[start:position]
            return token if token.startswith('"') else None
    return None
