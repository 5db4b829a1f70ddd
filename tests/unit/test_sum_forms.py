"""Sums as multisets of their terms (verify/sum_forms.py): every equality stated holds on
concrete tensors, and only additions that are sums of their operands as written are opened."""

from __future__ import annotations

import re

import pytest
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


# an expert-parallel rank accumulates flat (tokens, hidden) and views its sum back to the
# activation's shape before the all-reduce; Megatron-core's all-gather token dispatcher, batch
# first, moves the sequence to dim 0 for the reduce-scatter: the sum of the movements is the
# movement of the sum
@pytest.mark.parametrize(
    ("op", "text", "move"),
    [("View", "3,2", lambda t: t.view(3, 2)), ("Permute", "1,0", lambda t: t.permute(1, 0))],
    ids=["viewed", "transposed"],
)
def test_a_reduction_of_chains_moved_alike_is_that_movement_of_all_their_terms(op, text, move) -> None:
    p = Program()
    chains = [
        p.add(f"$r{r}b", p.add(f"$r{r}a", p.zeros(f"$z{r}"), p.leaf(f"$t{r}0")), p.leaf(f"$t{r}1")) for r in (0, 1)
    ]
    moved = [f"$m{r}" for r in (0, 1)]
    note = p.forms.note_view if op == "View" else p.forms.note_permute
    for value, chain in zip(moved, chains, strict=True):
        p.values[value] = move(p.values[chain])
        note(value, chain, text, _meta())
    total = f"(SumN (multiset-of {' '.join(moved)}))"
    (fact,) = p.forms.total_facts(total, moved)
    assert fact == f'(union {total} ({op} (SumN (multiset-of $t00 $t01 $t10 $t11)) "{text}"))'
    terms = sum(p.values[t] for t in ("$t00", "$t01", "$t10", "$t11"))
    assert torch.allclose(p.values["$m0"] + p.values["$m1"], move(terms))


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


def _plus_zero_bias(x: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device)
    return (x + zeros) * (x - zeros) + (zeros - x)  # 0 - x is -x, never x


def test_a_broadcast_bias_of_zeros_added_or_subtracted_is_stated_away_and_it_holds() -> None:
    from term_values import traced, unions_hold

    from shardproof.verify.encode import encode_unit

    graph = traced(_plus_zero_bias, (2, 3, 4))
    commands = encode_unit(graph, {}, []).commands
    # in graph order: x + 0, x - 0, 0 - x (then the product and the last sum)
    x_plus, x_minus, zero_minus = [n for n in graph.nodes if n.op == "binary" and n.attrs["fn"] in ("add", "sub")][:3]
    assert (x_plus.attrs["fn"], x_minus.attrs["fn"], zero_minus.attrs["fn"]) == ("add", "sub", "sub")
    stated = {c.split()[1] for c in commands if c.startswith("(union ")}
    assert f"$reference__{x_plus.id}" in stated and f"$reference__{x_minus.id}" in stated
    assert f"$reference__{zero_minus.id}" not in stated, "0 - x is not x"
    (zeros,) = [n for n in graph.nodes if n.op == "constant"]
    assert zeros.attrs.get("zero")
    known = {zeros.attrs["digest"]: torch.zeros(4, dtype=torch.float64)}
    assert unions_hold(commands, {"0": torch.randn(2, 3, 4, dtype=torch.float64)}, known) >= 2
