"""Instantiate a rule on concrete tensors and check it.

A rule is read back from its own egglog text. An instance recipe (instances.py) binds the free
values of its pattern (the tensors, dims, ranges and op names it matches); the harness derives
every other value from the premises (a term pattern computes its value; a selection, share, mask
or window premise defines the rank value it relates), checks that every premise holds, and then
checks every conclusion against meaning.py. A rule is instantiated for every rank of worlds of
1 to 4 ranks: a partial-sum conclusion is a claim about all ranks of a world together (the
contributions of a tiling of [0, K) add up to the value), so it is checked across them.

A near miss binds values its side conditions reject. The harness checks that the rest of the
pattern still matches (only a side condition rejects it) and that the conclusion would be false
on it, so the side condition is what keeps the rule sound there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..verify import layout_facts, scalars
from ..verify.rules import Rule, all_rules, casts_are_linear, fact_text
from . import meaning
from .generation import Gen, Recipe, RecipeError, combine
from .meaning import MultiSet, Unbound, Undefined, same
from .sexpr import Sym, head, read, read_all, symbols

WORLD_SIZES = (1, 2, 3, 4)
TRIALS = 3

# Relations stating a class of ops (rules.py facts), and relations the encoder states about the
# graph (how a view, permutation or expansion maps dims; which values feed an all-reduce).
CLASS_RELATIONS = {
    "linear-unary",
    "real-cast",
    "scaling",
    "additive",
    "multiplicative",
    "additive-reduction",
    "unit-reduction",
    "negation",
}
# Facts about permutations themselves (their texts), not about a tensor; how two permutations
# compose is a fact about the pair.
PERMUTATION_RELATIONS = {"pmap", "ptail"}
COMPOSITION_RELATIONS = {"pcompose", "pinverse"}
FRONT_END_RELATIONS = {"vkeep", "vsplit", "vmerge", "vunit", "vsqueeze", "emap", "ebk", "ebsrc"} | PERMUTATION_RELATIONS
FRONT_END_RELATIONS |= COMPOSITION_RELATIONS
# Which values a program computes (`node`): a rule may confine itself to them, a choice of cost that
# says nothing of values (no side condition: every instance of it is one of the rule without it).
GRAPH_HINTS = {"node"}
_STRUCTURAL_HEADS = set(meaning.TENSOR_CONSTRUCTORS) | meaning.RANGE_CONSTRUCTORS
_STRUCTURAL_HEADS |= {"multiset-of", "multiset-insert", "multiset-remove"}
# Casts of every dtype the capture can produce: the encoder declares the ones it sees.
_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclass
class ParsedRule:
    rule: Rule
    premises: list[Any]
    guards: list[bool]  # per premise: a side condition (comparison, size or class condition)
    conclusions: list[Any]

    @property
    def guarded(self) -> bool:
        return any(self.guards)

    def guard_text(self) -> list[str]:
        return [_show(p) for p, g in zip(self.premises, self.guards, strict=True) if g]


def _show(form: Any) -> str:
    if isinstance(form, tuple):
        return "(" + " ".join(_show(f) for f in form) + ")"
    return repr(form)


def _structural(form: Any) -> bool:
    name = head(form)
    if name == "=":
        return any(head(side) in _STRUCTURAL_HEADS for side in form[1:])
    return name not in meaning.COMPARISONS and name not in CLASS_RELATIONS


def parse(rule: Rule) -> ParsedRule:
    form = read(rule.text)
    kind = head(form)
    if kind == "rewrite":
        lhs, rhs, *options = form[1:]
        conditions: list[Any] = []
        if options:
            if options[0] != Sym(":when"):
                raise ValueError(f"{rule.name}: unknown option {options[0]!r}")
            conditions = list(options[1])
        premises = [(Sym("="), Sym("$lhs"), lhs), *conditions]
        conclusions = [(Sym("union"), Sym("$lhs"), rhs)]
    elif kind == "rule":
        premises, conclusions = list(form[1]), list(form[2])
    else:
        raise ValueError(f"{rule.name}: not a rule or rewrite")
    pattern_vars: set[str] = set()
    for premise in premises:
        if _structural(premise):
            pattern_vars |= symbols(premise)
    guards = []
    seen: set[str] = set()
    for premise in premises:
        if _structural(premise) or head(premise) in GRAPH_HINTS:
            guards.append(False)
        elif head(premise) == "=":
            # `(= n (sz x d))` merely names a size when n is new; it is a condition when n is
            # also part of the pattern or already known.
            binds = any(
                isinstance(side, Sym) and side.name not in pattern_vars and side.name not in seen
                for side in premise[1:]
            )
            guards.append(not binds)
        else:
            guards.append(True)
        seen |= symbols(premise)
    return ParsedRule(rule, premises, guards, conclusions)


def parsed_rules() -> list[ParsedRule]:
    return [parse(r) for r in all_rules()]


@functools.cache
def class_facts() -> frozenset[tuple[str, str]]:
    facts = set()
    for form in read_all(fact_text() + "\n" + casts_are_linear(set(_DTYPES))):
        if head(form) in CLASS_RELATIONS:
            facts.add((head(form), form[1].text))
    return frozenset(facts)


# -- checking -----------------------------------------------------------------------------------------------
@dataclass
class Partial:
    """One rank's partial-sum conclusion, checked with the other ranks of its world."""

    value: torch.Tensor
    contribution: torch.Tensor
    start: int
    end: int
    size: int
    kind: str = "sum"  # "max": a partial max
    selected: list[int] | None = None  # an index set's contribution (psumi): its indices, not [start, end)


@dataclass
class InstanceResult:
    failed_guards: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # conclusions that do not hold
    partials: list[Partial] = field(default_factory=list)
    vacuous: int = 0  # pending selections whose range list has no value (they never become facts)
    definite: int = 0


class Instance:
    def __init__(self, parsed: ParsedRule, gen: Gen, bindings: dict[str, Any], facts: frozenset[tuple[str, str]]):
        self.parsed = parsed
        self.gen = gen
        self.env = dict(bindings)
        self.evaluate = meaning.Evaluator(self.env)
        self.facts = facts

    # premises --------------------------------------------------------------------------------------------
    def run(self, near_miss: bool) -> InstanceResult:
        result = InstanceResult()
        pending = list(range(len(self.parsed.premises)))
        while pending:
            for index in pending:
                premise = self.parsed.premises[index]
                try:
                    holds = self._premise(premise)
                except Unbound:
                    continue
                except Undefined as exc:
                    holds = False
                    detail = str(exc)
                else:
                    detail = ""
                pending.remove(index)
                if not holds:
                    if self.parsed.guards[index]:
                        result.failed_guards.append(_show(premise))
                    else:
                        raise RecipeError(f"the pattern does not match: {_show(premise)} fails {detail}".strip())
                break
            else:
                names = set()
                for index in pending:
                    names |= symbols(self.parsed.premises[index]) - set(self.env)
                waiting = [_show(self.parsed.premises[i]) for i in pending]
                raise RecipeError(f"nothing binds {sorted(names)} in {waiting}")
        if result.failed_guards and not near_miss:
            raise RecipeError(f"the instance fails the side condition {result.failed_guards[0]}")
        for conclusion in self.parsed.conclusions:
            self._conclusion(conclusion, result)
        return result

    def _premise(self, form: Any) -> bool:
        name = head(form)
        if name == "=":
            left, right = form[1], form[2]
            for target, source in ((left, right), (right, left)):
                if isinstance(target, Sym) and target.name not in self.env:
                    self.env[target.name] = self.evaluate(source)
                    return True
            return same(self.evaluate(left), self.evaluate(right))
        if name in meaning.COMPARISONS:
            return meaning.COMPARISONS[name](self.evaluate(form[1]), self.evaluate(form[2]))
        if name in CLASS_RELATIONS:
            return (name, self.evaluate(form[1])) in self.facts
        if name in FRONT_END_RELATIONS:
            return self._front_end(name, form[1:])
        if name == "multiset-contains":
            members, member = self.evaluate(form[1]), self.evaluate(form[2])
            return isinstance(members, MultiSet) and any(same(m, member) for m in members)
        if name in ("arin", "a2a-piece") or name in GRAPH_HINTS:  # facts about the graph, not about values
            self.evaluate(form[1])
            return True
        defined = _DEFINED_ARGUMENT.get(name)
        if defined is not None:
            target = form[1 + defined]
            if isinstance(target, Sym) and target.name not in self.env:
                args = [None if i == defined else self.evaluate(a) for i, a in enumerate(form[1:])]
                self.env[target.name] = _DEFINE[name](self.gen, *args)
        return self._holds(name, [self.evaluate(a) for a in form[1:]], premise=True)

    def _front_end(self, name: str, forms: list[Any]) -> bool:
        """A fact the front end states about a view, permute or expand of the instance. An
        unbound argument (the view's shape outside the related dims) takes the stated value."""
        subject = "t"
        if name in PERMUTATION_RELATIONS | COMPOSITION_RELATIONS:
            text = self.evaluate(forms[0])
            first = [int(p) for p in text.split(",")]
            if name in COMPOSITION_RELATIONS:
                then = [int(p) for p in self.evaluate(forms[1]).split(",")]
                stated = layout_facts.composition_facts(first, then)
            else:
                stated = layout_facts.permute_facts(first)
            return self._stated(name, f'"{text}"', stated, forms)
        made = self.evaluate.made.get(id(self.evaluate(forms[0])))
        if made is None:
            return False
        if made.kind == "View":
            stated = layout_facts.view_facts("t", made.in_shape, made.out_shape)
        elif made.kind == "Permute":
            stated = layout_facts.permute_facts([int(p) for p in made.text.split(",")])
            subject = f'"{made.text}"'
        else:
            stated = layout_facts.expand_facts("t", made.in_shape, made.out_shape)
            stated += layout_facts.broadcast_facts("t", made.in_shape, made.out_shape)
        return self._stated(name, subject, stated, forms)

    def _stated(self, name: str, subject: str, stated: list[str], forms: list[Any]) -> bool:
        """Whether the front end states the fact `(name subject ...forms[1:])`; an unbound argument
        takes the stated value."""
        unbound = [i for i, f in enumerate(forms[1:]) if isinstance(f, Sym) and f.name not in self.env]
        known = {i: str(self.evaluate(f)) for i, f in enumerate(forms[1:]) if i not in unbound}
        for fact in stated:
            if not fact.startswith(f"({name} {subject} "):
                continue
            words = fact[len(f"({name} {subject} ") : -1].split(" ")
            if len(words) != len(forms) - 1 or any(words[i].strip('"') != text for i, text in known.items()):
                continue
            for i in unbound:  # a quoted word is a string (a shape or a permutation), else an i64
                word = words[i]
                self.env[forms[1 + i].name] = word.strip('"') if word.startswith('"') else int(word)
            return True
        return False

    def _holds(self, name: str, args: list[Any], premise: bool) -> bool:
        if name in ("sel", "selp"):
            big, small, dim, ranges = args
            return same(small, meaning.select(big, dim, ranges))
        if name == "selw":
            big, small, dim, low, high, n = args
            return low <= high and all(
                same(small, meaning.narrow_range(big, dim, s, s + n)) for s in range(low, high + 1)
            )
        if name == "evaluated":
            return meaning.is_plain(args[0])
        if name == "scintprod":  # a front-end fact: the product of two integer factors
            first, then, product = args
            return first * then == product
        if name in ("scprod", "scprodrecip"):
            # a front-end fact: the product of two factors (the encoder's, of their unrounded values),
            # true to the significant digits the verifier keeps of any number (scalars.py)
            first, then, product = args
            value = float(product) if name == "scprod" else 1.0 / int(product)
            return math.isclose(float(first) * float(then), value, rel_tol=10.0 ** (2 - scalars.SIGNIFICANT_DIGITS))

        if name == "frac":
            big, small, p, q = args
            return q != 0 and same(small, big * p / q)
        if name == "outside":
            mask, ids, start, end = args
            return same(mask, meaning.outside(ids, start, end))
        if name == "inside":
            mask, ids, start, end = args
            return same(mask, ~meaning.outside(ids, start, end))
        if name == "localids":
            local, ids, start, end = args
            return same(local, torch.where(meaning.outside(ids, start, end), 0, ids - start))
        if name == "embpart":
            partial, lookup, mask, _start, _end = args
            keep = ~mask.bool()
            return partial.shape == lookup.shape and same(partial[keep], lookup[keep])
        if name == "vshape":  # a front-end fact: the value's shape, as the view's shape text writes it
            tensor, text = args
            return ",".join(str(n) for n in tensor.shape) == text
        if name == "tiled":  # m copies of the range [s, e), the i-th shifted by i * h
            ranges, start, end, period, copies = args
            return meaning.indices(ranges) == [i * period + j for i in range(copies) for j in range(start, end)]
        if name == "ascending":
            selected = meaning.indices(args[0])
            return bool(selected) and meaning.ascending(selected)
        if name in ("psumi", "coveri", "coverip") and premise:
            # (psumi X x R K): x is the contribution of the indices R; (coveri Z ms U K): the
            # members add up to the contribution of the indices U
            total, held, ranges, size = args
            measure = self.gen.measures.get(id(total))
            if measure is None:
                raise RecipeError(f"a {name} premise needs its value made by gen.total(measure)")
            selected = meaning.indices(ranges)
            if name != "psumi":
                if not isinstance(held, MultiSet):
                    return False
                held = combine("sum", held)
            return (
                measure.combine == "sum"
                and measure.size == size
                and all(0 <= i < size for i in selected)
                and same(held, measure.part_of(selected))
            )
        if name in ("psum", "pmax") and premise:
            total, contribution, start, end, size = args
            measure = self.gen.measures.get(id(total))
            if measure is None:
                raise RecipeError(f"a {name} premise needs its value made by gen.total(measure)")
            kind = "max" if name == "pmax" else "sum"
            return (
                measure.combine == kind
                and measure.size == size
                and 0 <= start <= end <= size
                and same(contribution, measure.part(start, end))
            )
        if name in ("pplus", "coverb"):
            # (pplus Y A y s e K): y is A's contribution [s, e) plus the term Y - A;
            # (coverb Y A ms e K n): the members add up to A's contribution [0, e) plus n terms
            whole, value, *rest = args
            measure = self.gen.measures.get(id(value))
            if measure is None:
                raise RecipeError(f"a {name} needs its A made by gen.total(measure)")
            term = whole - value
            if name == "pplus":
                contribution, start, end, size = rest
                expected, held = measure.part(start, end) + term, contribution
                bounds = 0 <= start <= end <= size
            else:
                members, end, size, copies = rest
                if not isinstance(members, MultiSet):
                    return False
                expected, held = measure.part(0, end) + copies * term, combine("sum", members)
                bounds = 0 < end <= size and copies in (0, 1)
            return measure.combine == "sum" and measure.size == size and bounds and same(held, expected)
        if name == "subcover":
            # (subcover S Z rest e K): S is the sum of `rest` plus Z's contribution [0, e)
            whole, total, rest, end, size = args
            measure = self.gen.measures.get(id(total))
            if measure is None:
                raise RecipeError("a subcover needs its Z made by gen.total(measure)")
            return (
                isinstance(rest, MultiSet)
                and measure.combine == "sum"
                and measure.size == size
                and 0 < end <= size
                and same(whole, combine("sum", rest) + measure.part(0, end) if rest else measure.part(0, end))
            )
        if name in ("cover", "maxcover"):
            total, members, end, size = args
            measure = self.gen.measures.get(id(total))
            if measure is None:
                raise RecipeError(f"a {name} needs its value made by gen.total(measure)")
            kind = "max" if name == "maxcover" else "sum"
            return (
                isinstance(members, MultiSet)
                and measure.combine == kind
                and measure.size == size
                and 0 < end <= size
                and same(combine(kind, members), measure.part(0, end))
            )
        raise ValueError(f"no meaning for relation {name}")

    # conclusions -------------------------------------------------------------------------------------------
    def _conclusion(self, form: Any, result: InstanceResult) -> None:
        name = head(form)
        try:
            if name in ("subsume", "a2a-piece"):  # an e-graph hint, a fact about the graph: no claim on values
                return
            if name == "union":
                holds = same(self.evaluate(form[1]), self.evaluate(form[2]))
            elif name == "set":
                target, value = form[1], self.evaluate(form[2])
                tensor = self.evaluate(target[1])
                if head(target) == "nd":
                    holds = tensor.dim() == value
                else:
                    dim = self.evaluate(target[2])
                    holds = -tensor.dim() <= dim < 0 and tensor.shape[dim] == value
            elif name in ("psum", "pmax"):
                value, contribution, start, end, size = (self.evaluate(a) for a in form[1:])
                kind = "max" if name == "pmax" else "sum"
                result.partials.append(Partial(value, contribution, start, end, size, kind))
                return
            elif name == "psumi":
                value, contribution, ranges, size = (self.evaluate(a) for a in form[1:])
                selected = meaning.indices(ranges)
                result.partials.append(Partial(value, contribution, 0, 0, size, "sum", selected))
                return
            elif name in ("coveri", "coverip"):
                holds = self._holds(name, [self.evaluate(a) for a in form[1:]], premise=True)
            elif name == "selp":
                args = [self.evaluate(a) for a in form[1:]]
                try:
                    meaning.indices(args[3])
                except Undefined:
                    result.vacuous += 1  # never becomes a fact: nothing to check
                    return
                result.definite += 1
                holds = self._holds(name, args, premise=False)
            else:
                holds = self._holds(name, [self.evaluate(a) for a in form[1:]], premise=False)
        except Undefined as exc:
            result.wrong.append(f"{_show(form)} has no value ({exc})")
            return
        except Unbound as exc:
            raise RecipeError(f"the conclusion {_show(form)} uses {exc.name}, which nothing binds") from exc
        if not holds:
            result.wrong.append(f"{_show(form)} is false")


def _define_window(gen: Gen, big: Any, _small: Any, dim: int, low: int, high: int, n: int) -> Any:
    return meaning.narrow_range(big, dim, low, low + n)


def _define_partial_lookup(gen: Gen, _partial: Any, lookup: Any, mask: Any, start: int, end: int) -> Any:
    noise = torch.randn(lookup.shape, dtype=lookup.dtype, generator=gen.generator)
    keep = ~mask.bool().unsqueeze(-1).expand(lookup.shape)
    return torch.where(keep, lookup, noise)


# Relations that define the rank value they relate (the argument at this position) when a premise
# names it for the first time: a premise `(sel W w -2 R)` makes w the selection R of W.
_DEFINED_ARGUMENT = {"sel": 1, "selp": 1, "selw": 1, "frac": 1, "outside": 0, "inside": 0, "localids": 0, "embpart": 0}
_DEFINE: dict[str, Callable[..., Any]] = {
    "sel": lambda gen, big, _, dim, ranges: meaning.select(big, dim, ranges),
    "selp": lambda gen, big, _, dim, ranges: meaning.select(big, dim, ranges),
    "selw": _define_window,
    "frac": lambda gen, big, _, p, q: big * p / q,
    "outside": lambda gen, _, ids, start, end: meaning.outside(ids, start, end),
    "inside": lambda gen, _, ids, start, end: ~meaning.outside(ids, start, end),
    "localids": lambda gen, _, ids, start, end: torch.where(meaning.outside(ids, start, end), 0, ids - start),
    "embpart": _define_partial_lookup,
}


def _partials_wrong(partials: list[Partial]) -> str | None:
    """A world's partial-sum conclusions must tile [0, K) and add up to the value."""
    if not partials:
        return None
    first = partials[0]
    if any(p.size != first.size or p.kind != first.kind or not same(p.value, first.value) for p in partials):
        return "the ranks' partial sums are of different values"
    if any(p.selected is not None for p in partials):
        covered = sorted(i for p in partials for i in p.selected or ())
        if covered != list(range(first.size)):
            return f"the ranks' index sets {[p.selected for p in partials]} do not partition [0, {first.size})"
    else:
        pieces = sorted((p.start, p.end) for p in partials)
        edges = [0] + [end for _, end in pieces]
        if [start for start, _ in pieces] != edges[:-1] or edges[-1] != first.size:
            return f"the ranks' contributions {pieces} do not tile [0, {first.size})"
    total = combine(first.kind, [p.contribution for p in partials])
    if not same(total, first.value):
        error = (total - first.value).abs().max().item() if total.shape == first.value.shape else "shape"
        return f"the ranks' contributions do not add up to the value (max error {error})"
    return None


@dataclass
class RuleReport:
    name: str
    instances: int = 0
    near_misses: int = 0
    problems: list[str] = field(default_factory=list)  # the rule is wrong
    recipe_problems: list[str] = field(default_factory=list)  # the check is wrong

    @property
    def ok(self) -> bool:
        return not self.problems and not self.recipe_problems


def check_rule(
    parsed: ParsedRule,
    recipe: Recipe,
    near_miss: Recipe | None,
    trials: int = TRIALS,
    worlds: tuple[int, ...] = WORLD_SIZES,
) -> RuleReport:
    report = RuleReport(parsed.rule.name)
    facts = class_facts()
    vacuous = definite = 0
    wrong_near_misses = 0
    for mode, make in (("instance", recipe), ("near miss", near_miss)):
        if make is None:
            continue
        for trial in range(trials):
            for world in worlds:
                partials: list[Partial] = []
                world_wrong = False
                accepted = rejected = 0
                for rank in range(world):
                    gen = Gen(parsed.rule.name, trial if mode == "instance" else 1000 + trial, world, rank)
                    where = f"{mode} trial {trial}, rank {rank} of {world}"
                    try:
                        bindings = make(gen)
                        if bindings is None:  # this rank has no instance of the pattern
                            continue
                        result = Instance(parsed, gen, bindings, facts).run(near_miss=mode == "near miss")
                    except RecipeError as exc:
                        report.recipe_problems.append(f"{where}: {exc}")
                        continue
                    except (Undefined, Unbound, TypeError, ValueError, RuntimeError, IndexError, KeyError) as exc:
                        report.recipe_problems.append(f"{where}: {type(exc).__name__} {exc}")
                        continue
                    partials.extend(result.partials)
                    vacuous += result.vacuous
                    definite += result.definite
                    if mode == "instance":
                        report.instances += 1
                        report.problems.extend(f"{where}: {w}" for w in result.wrong)
                    elif result.failed_guards:
                        report.near_misses += 1
                        rejected += 1
                        world_wrong |= bool(result.wrong)
                    else:
                        accepted += 1
                        if result.wrong:
                            report.problems.append(
                                f"{where}: the side conditions accept a near miss on which {result.wrong[0]}"
                            )
                problem = _partials_wrong(partials)
                if mode == "instance" and problem:
                    report.problems.append(f"trial {trial}, world {world}: {problem}")
                elif problem and accepted and not rejected:
                    report.problems.append(
                        f"near miss trial {trial}, world {world}: the side conditions accept it, and {problem}"
                    )
                elif problem or world_wrong:
                    wrong_near_misses += 1
                if accepted and not report.problems:
                    report.recipe_problems.append(
                        f"near miss trial {trial}, world {world}: passes every side condition"
                    )
    if report.instances == 0:
        report.recipe_problems.append("the recipe produced no instance")
    if vacuous and not definite:
        report.recipe_problems.append("every pending selection was undefined: the check is vacuous")
    if near_miss is not None and not report.near_misses:
        report.recipe_problems.append("the near-miss recipe produced no instance")
    elif near_miss is not None and not wrong_near_misses:
        report.recipe_problems.append(
            "no near miss makes the conclusion false: it shows no need for the side condition"
        )
    return report


__all__ = ["ParsedRule", "RecipeError", "RuleReport", "check_rule", "parse", "parsed_rules"]
