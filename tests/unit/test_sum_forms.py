"""Sums as multisets of their terms (verify/sum_forms.py): every equality stated holds on
concrete tensors, and only additions that are sums of their operands as written are opened."""

from __future__ import annotations

import re

import torch

from shardproof.graph.model import TensorMeta
from shardproof.verify.sum_forms import SumForms

SHAPE = (2, 3)


def _meta(shape=SHAPE, dtype="float64") -> TensorMeta:
    return TensorMeta(shape, dtype)


class Program:
    """Terms with concrete values, recorded in a SumForms as an encoder records them."""

    def __init__(self) -> None:
        self.forms = SumForms()
        self.values: dict[str, torch.Tensor] = {}
        self.generator = torch.Generator().manual_seed(0)

    def leaf(self, name: str, shape=SHAPE) -> str:
        self.values[name] = torch.randn(shape, generator=self.generator, dtype=torch.float64)
        return name

    def zeros(self, name: str) -> str:
        self.values[name] = torch.zeros(SHAPE, dtype=torch.float64)
        self.forms.add_zero(name)
        return name

    def add(self, name: str, a: str, b: str) -> str:
        self.values[name] = self.values[a] + self.values[b]
        metas = [_meta(tuple(self.values[x].shape)) for x in (a, b)]
        self.forms.note_addition(name, [a, b], metas, _meta(tuple(self.values[name].shape)))
        return name

    def holds(self, fact: str) -> bool:
        match = re.fullmatch(r"\(union (\S+) (?:\(SumN \(multiset-of ([^)]*)\)\)|(\S+))\)", fact)
        assert match is not None, fact
        term, parts, single = match.groups()
        value = self.values[term]
        total = sum(self.values[p] for p in (parts.split() if parts else [single]))
        return torch.allclose(value, total)


def test_a_chain_started_from_zeros_is_the_sum_of_its_terms() -> None:
    p = Program()
    out = p.add("$s1", p.zeros("$z"), p.leaf("$a"))
    out = p.add("$s2", out, p.leaf("$b"))
    out = p.add("$s3", out, p.leaf("$c"))
    facts = p.forms.chain_facts()
    assert facts == ["(union $s3 (SumN (multiset-of $a $b $c)))"]  # one fact, for the maximal chain
    assert all(p.holds(f) for f in facts)


def test_grouping_and_order_do_not_matter() -> None:
    p = Program()
    left = p.add("$l", p.add("$ab", p.leaf("$a"), p.leaf("$b")), p.leaf("$c"))
    right = p.add("$r", p.leaf("$c2"), p.add("$ba", "$b", "$a"))
    assert sorted(p.forms.terms[left]) == ["$a", "$b", "$c"]
    assert sorted(p.forms.terms[right]) == ["$a", "$b", "$c2"]
    assert all(p.holds(f) for f in p.forms.chain_facts())


def test_adding_zeros_is_the_other_operand() -> None:
    p = Program()
    p.add("$s", p.zeros("$z"), p.leaf("$a"))
    assert p.forms.chain_facts() == ["(union $s $a)"]


def test_a_plain_addition_says_nothing_new() -> None:
    p = Program()
    p.add("$s", p.leaf("$a"), p.leaf("$b"))
    assert p.forms.chain_facts() == []


def test_broadcasting_and_promotion_are_not_opened() -> None:
    p = Program()
    bias = p.leaf("$bias", shape=(3,))
    inner = p.add("$inner", p.leaf("$a"), p.leaf("$b"))
    p.add("$biased", inner, bias)  # broadcast: not a sum of same-shape terms
    assert "$biased" not in p.forms.terms
    forms = SumForms()
    forms.note_addition("$y", ["$i", "$f"], [_meta(dtype="int64"), _meta()], _meta())
    forms.note_addition("$m", ["$p", "$q"], [_meta(dtype="bool"), _meta(dtype="bool")], _meta(dtype="bool"))
    assert forms.terms == {}


def test_an_all_reduce_of_partial_chains_is_the_sum_of_all_their_terms() -> None:
    p = Program()
    rank0 = p.add("$r0b", p.add("$r0a", p.zeros("$z0"), p.leaf("$t0")), p.leaf("$t1"))
    rank1 = p.add("$r1b", p.add("$r1a", p.zeros("$z1"), p.leaf("$t2")), p.leaf("$t3"))
    total = f"(SumN (multiset-of {rank0} {rank1}))"
    (fact,) = p.forms.total_facts(total, [rank0, rank1])
    assert fact == f"(union {total} (SumN (multiset-of $t0 $t1 $t2 $t3)))"
    reduced = p.values[rank0] + p.values[rank1]
    assert torch.allclose(reduced, sum(p.values[t] for t in ("$t0", "$t1", "$t2", "$t3")))
    assert p.forms.total_facts("(SumN (multiset-of $t0 $t1))", ["$t0", "$t1"]) == []  # nothing opened


def test_an_all_reduce_of_chains_viewed_alike_is_that_view_of_all_their_terms() -> None:
    # an expert-parallel rank accumulates flat (tokens, hidden) and views its sum back to the
    # activation's shape before the all-reduce: the sum of the views is the view of the sum
    p = Program()
    chains = [
        p.add(f"$r{r}b", p.add(f"$r{r}a", p.zeros(f"$z{r}"), p.leaf(f"$t{r}0")), p.leaf(f"$t{r}1")) for r in (0, 1)
    ]
    views = [f"$v{r}" for r in (0, 1)]
    for view, chain in zip(views, chains, strict=True):
        p.values[view] = p.values[chain].view(3, 2)
        p.forms.note_view(view, chain, "3,2", _meta())
    total = f"(SumN (multiset-of {' '.join(views)}))"
    (fact,) = p.forms.total_facts(total, views)
    assert fact == f'(union {total} (View (SumN (multiset-of $t00 $t01 $t10 $t11)) "3,2"))'
    terms = sum(p.values[t] for t in ("$t00", "$t01", "$t10", "$t11"))
    assert torch.allclose(p.values["$v0"] + p.values["$v1"], terms.view(3, 2))


def test_a_reduce_scatter_of_chains_transposed_alike_is_that_transpose_of_all_their_terms() -> None:
    # Megatron-core's all-gather token dispatcher, batch first: each rank sums its own experts'
    # outputs and moves the sequence to dim 0 for the reduce-scatter; the sum of the permutes is
    # the permute of the sum (the reduce-scatter's slice is taken of that)
    p = Program()
    chains = [
        p.add(f"$r{r}b", p.add(f"$r{r}a", p.zeros(f"$z{r}"), p.leaf(f"$t{r}0")), p.leaf(f"$t{r}1")) for r in (0, 1)
    ]
    moved = [f"$p{r}" for r in (0, 1)]
    for value, chain in zip(moved, chains, strict=True):
        p.values[value] = p.values[chain].permute(1, 0)
        p.forms.note_permute(value, chain, "1,0", _meta())
    total = f"(SumN (multiset-of {' '.join(moved)}))"
    (fact,) = p.forms.total_facts(total, moved)
    assert fact == f'(union {total} (Permute (SumN (multiset-of $t00 $t01 $t10 $t11)) "1,0"))'
    terms = sum(p.values[t] for t in ("$t00", "$t01", "$t10", "$t11"))
    assert torch.allclose(p.values["$p0"] + p.values["$p1"], terms.permute(1, 0))


def test_a_view_and_a_permute_are_not_taken_for_one_movement() -> None:
    p = Program()
    chains = [p.add(f"$c{r}", p.add(f"$d{r}", p.zeros(f"$z{r}"), p.leaf(f"$a{r}")), p.leaf(f"$b{r}")) for r in (0, 1)]
    p.forms.note_permute("$m0", chains[0], "1,0", _meta())
    p.forms.note_view("$m1", chains[1], "1,0", _meta())
    assert p.forms.total_facts("$total", ["$m0", "$m1"]) == []


def test_views_of_other_shapes_or_of_plain_values_are_not_opened() -> None:
    p = Program()
    chain = p.add("$c1", p.add("$c0", p.zeros("$z"), p.leaf("$a")), p.leaf("$b"))
    p.forms.note_view("$v0", chain, "3,2", _meta())
    p.forms.note_view("$v1", chain, "6", _meta())
    assert p.forms.total_facts("$total", ["$v0", "$v1"]) == []  # two different views
    p.forms.note_view("$w0", p.leaf("$x"), "3,2", _meta())
    p.forms.note_view("$w1", p.leaf("$y"), "3,2", _meta())
    assert p.forms.total_facts("$total", ["$w0", "$w1"]) == []  # nothing to open: the views are the terms
