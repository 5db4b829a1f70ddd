"""Every discrepancy kind (the editor's diagnostic code, the SARIF rule id) has its README entry:
the code's link in the editor opens that anchor."""

from __future__ import annotations

from pathlib import Path

from shardproof.results import DISCREPANCY_KINDS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_discrepancy_kind_has_a_readme_anchor() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [kind for kind in DISCREPANCY_KINDS if f'<a id="discrepancy-kinds-{kind}"></a>**{kind}**' not in text]
    assert not missing
