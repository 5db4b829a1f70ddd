"""The rule library is data: well-formed, uniquely named, and loadable into egglog."""

from shardproof.verify import rules
from shardproof.verify.egglog_adapter import EGraph
from shardproof.verify.language import DECLARATIONS


def test_rule_names_are_unique_and_families_declared() -> None:
    names = [r.name for r in rules.all_rules()]
    assert len(names) == len(set(names))
    assert {r.family for r in rules.all_rules()} <= set(rules.FAMILIES)
    assert all(r.meaning for r in rules.all_rules())


def test_library_loads_into_egglog() -> None:
    egraph = EGraph()
    egraph.run_text(DECLARATIONS)
    egraph.run_text(rules.program_text())
    outcome = egraph.run_schedule(rules.schedule(1))
    assert not outcome.updated  # nothing to do on an empty e-graph


def test_every_family_has_rules() -> None:
    """Except `derived`, whose rules each unit brings (laws of its opaque calls, verify/op_laws.py)."""
    families = {r.family for r in rules.all_rules()}
    assert families == set(rules.FAMILIES) - {"derived"}
