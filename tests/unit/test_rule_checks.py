"""Every rule of the library holds on concrete tensors, and its side conditions reject the cases
where it would be wrong (see shardproof/rulecheck). A rule added without a check fails here."""

from __future__ import annotations

import dataclasses

import pytest

from shardproof.rulecheck.harness import check_rule, class_facts, parse, parsed_rules
from shardproof.rulecheck.instances import INSTANCES, NEAR_MISSES
from shardproof.verify.rules import Rule, all_rules

RULES = {parsed.rule.name: parsed for parsed in parsed_rules()}


def test_every_rule_has_an_instance_recipe_and_no_recipe_is_stale() -> None:
    missing = sorted(set(RULES) - set(INSTANCES))
    stale = sorted(set(INSTANCES) - set(RULES))
    assert not missing, f"rules without a concrete check (add them to rulecheck/instances.py): {missing}"
    assert not stale, f"checks of rules that no longer exist: {stale}"


def test_every_rule_with_side_conditions_has_a_near_miss() -> None:
    guarded = {name for name, parsed in RULES.items() if parsed.guarded}
    missing = sorted(guarded - set(NEAR_MISSES))
    assert not missing, f"rules whose side conditions are never shown to matter: {missing}"
    assert set(NEAR_MISSES) <= guarded, "a near miss for a rule without side conditions"


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_holds_on_concrete_tensors(name: str) -> None:
    report = check_rule(RULES[name], INSTANCES[name], NEAR_MISSES.get(name))
    assert not report.problems, f"rule {name} is unsound:\n" + "\n".join(report.problems[:5])
    assert not report.recipe_problems, f"the check of {name} is broken:\n" + "\n".join(report.recipe_problems[:5])
    assert report.instances >= 10
    if RULES[name].guarded:
        assert report.near_misses >= 10


def _mutant(name: str, old: str, new: str) -> Rule:
    rule = next(r for r in all_rules() if r.name == name)
    assert old in rule.text, (name, old)
    return dataclasses.replace(rule, text=rule.text.replace(old, new))


# Wrong versions of real rules: each must be caught, as unsound or as a side condition that no
# longer rejects its near miss.
MUTANTS = [
    ("slice-of-binary", " (= n (sz y d))", ""),  # an operand broadcast along the sliced dim
    ("one-copy-of-a-repeated-slice", "(- (+ (* s m) m) 1)", "(+ (* s m) m)"),  # a window past the copies
    ("column-parallel-linear", "((sel Y y -1 R))", "((sel Y y -2 R))"),  # the wrong output dim
    ("range-shift-cons", "(+ e k)", "(+ e 1)"),  # shifts one end only
    ("slice-of-concat-second", "(- s na) (- e na)", "(- s na) (- e (- na 1))"),  # off by one
    ("row-parallel-linear", "((psum Y y s e K))", "((psum Y y 0 e K))"),  # mislabelled contribution
    ("vocab-mask", '(ScI "ge" I e)', '(ScI "gt" I e)'),  # the last id of the shard counted outside
    ("repeat-fewer-copies", "(- (+ (* s m) m) m2)", "(+ (* s m) m)"),  # a window past the copies
    ("division-is-share", "(frac X x 1 n)", "(frac X x n 1)"),
    ("softmax-other-dim", " (!= d d2)", ""),  # the guard dropped
    ("expand-keeps-selection", " (= k1 k2)", ""),  # expansions of other sizes along another dim
    ("partial-plus-share", " (= (* (- e s) q) (* K p))", ""),  # adds a whole bias on every rank
    ("slice-of-concat-inside-first", "(<= e na)", "(<= e (+ na 1))"),  # a guard off by one
    ("view-merge", "(RMul R h)", "(RMul R 1)"),
    ("embedding-rows-of-ids", "(- d 1)", "d"),
    ("max-of-selection-is-partial", "((pmax Y y s e K))", "((pmax Y y 0 e K))"),  # mislabelled partial max
    ("target-pick-is-partial", "(outside m I s e)", "(outside m I 0 e)"),  # picks of other ranks' targets kept
    ("all-reduce-max-of-tiling", "(MaxN ms)", "(SumN ms)"),  # partial maxes summed
    ("index-set-cover-extend", "(RUnion U V)", "V"),  # forgets what the cover held
    ("view-merge-inner-selection", "(RTile R h m)", "(RTile R n m)"),  # tiles by the rank's inner size
    ("row-parallel-linear-over-index-set", "((psumi Y y R K))", "((psumi Y y (RCons s1 e1 (RNil)) K))"),
    ("range-ascending-cons", "(<= e s2)", "(<= s s2)"),  # overlapping ranges called ascending
    ("regroup-selected-sum-right", '(union y (Bin "add" a (Bin "add" c b)))', '(union y (Bin "add" a c))'),
    ("arithmetic-local-ids", "(localids l I s e)", "(localids l I 0 e)"),  # ids not re-based to the shard
    ("target-pick-is-partial-unsqueezed", "(outside mv Iv s e)", "(outside mv Iv 0 e)"),  # others' targets kept
    ("shape-permute-dim", "(set (sz y do) n)", "(set (sz y di) n)"),  # the input dim's size at the same place
    ("permute-of-permute", "(union y (Permute X r))", "(union y (Permute X q))"),  # the first permutation lost
    ("permute-then-broadcast-operand-right", " (<= m k)", ""),  # b read along a dim the permutation moves
    ("selection-of-permute-then-broadcast-operand-left", " (<= m k)", ""),
    ("binary-of-slice-and-broadcast", " (< k (- 0 d))", ""),  # an operand that has dim d (not broadcast)
    ("linear-of-leading-slice", "(< d -1)", "(< d 0)"),  # a slice of the features is not one of the outputs
    ("slice-of-concat-across", "(Slice b d 0 (- e na))", "(Slice b d 0 (- e s))"),  # the second part too long
    ("linear-of-permute", " (>= k 1)", ""),  # a permutation that moves the features
    ("softmax-of-permute", " (<= (- 0 d) k)", ""),  # a softmax along a dim the permutation moves
    ("reduction-of-permute", " (<= (- 0 d) k)", ""),
    ("permute-then-broadcast-operand-left", " (<= m k)", ""),
    ("term-cover-in-sum-extend", "(psum Z p e f K)", "(psum Z p 0 f K)"),  # a contribution counted twice
    ("sum-of-term-cover", "(subcover S Z rest K K)", "(subcover S Z rest e K)"),  # a cover not yet whole
    ("matmul-batch-broadcast-left", " (< (+ n d) 0)", ""),  # B has the dim: a selected index broadcasts back
]


@pytest.mark.parametrize(("name", "old", "new"), MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_wrong_rule_is_caught(name: str, old: str, new: str) -> None:
    parsed = parse(_mutant(name, old, new))
    report = check_rule(parsed, INSTANCES[name], NEAR_MISSES.get(name))
    assert not report.ok, f"the mutant of {name} ({old} -> {new}) passed its check"


def test_only_casts_to_floating_dtypes_are_linear() -> None:
    linear = {value for kind, value in class_facts() if kind == "linear-unary"}
    assert {"cast_float32", "cast_bfloat16", "cast_float64"} <= linear
    assert not {"cast_int64", "cast_int32", "cast_bool", "cast_uint8"} & linear
