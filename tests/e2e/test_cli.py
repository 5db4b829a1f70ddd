"""`shardproof verify` as users run it: exit codes, JSON, SARIF and the readable report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def shardproof(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardproof", *args], cwd=cwd, capture_output=True, text=True, timeout=900
    )


def test_json_verdicts_for_every_declared_world_size(example_root: Path) -> None:
    run = shardproof("verify", "--json", cwd=example_root)
    assert run.returncode == 0, run.stderr
    payload = json.loads(run.stdout)
    assert [c["name"] for c in payload["checks"]] == ["llama-tp", "llama-sp"]
    for check in payload["checks"]:
        assert check["verdict"] == "verified", check["name"]
        assert [(w["world_size"], w["verdict"]) for w in check["world_sizes"]] == [
            (2, "verified"),
            (4, "verified"),
            (8, "verified"),
        ]
    assert payload["exit_code"] == 0
    assert run.stderr.strip() == ""  # quiet: no progress, no warnings


def test_discrepancy_exit_code_text_report_and_sarif(tmp_path: Path) -> None:
    import bug_variants

    bug = bug_variants.variant("missing-all-reduce")
    project = bug_variants.materialize(bug, tmp_path / "variant")
    sarif_path = tmp_path / "out.sarif"
    run = shardproof("verify", "--project", str(project), "--world-size", "2", "--sarif", str(sarif_path))
    assert run.returncode == 1, run.stderr
    line = bug.line_number(project)
    assert f"llama_example/tp.py:{line}:" in run.stdout
    assert "[missing-reduction]" in run.stdout
    assert "return F.linear(x, self.weight) + self.bias" in run.stdout
    assert "witness:   confirmed numerically" in run.stdout and "output 0: max abs error" in run.stdout
    sarif = json.loads(sarif_path.read_text())
    assert sarif["version"] == "2.1.0"
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "missing-reduction" and result["level"] == "error"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "llama_example/tp.py"
    assert location["region"]["startLine"] == line
    assert result["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "llama_example/model.py"
    rule_ids = {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert "missing-reduction" in rule_ids


def test_errors_exit_2_with_a_location(tiny_root: Path, tmp_path: Path) -> None:
    run = shardproof("verify", "--project", str(tiny_root), "--check", "syntax-error")
    assert run.returncode == 2
    assert "tinymlp/broken.py:4" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr

    (tmp_path / "pyproject.toml").write_text("[tool.shardproof]\n[[tool.shardproof.check]]\nname = 'x'\n")
    run = shardproof("verify", "--project", str(tmp_path))
    assert run.returncode == 2
    assert "pyproject.toml:2" in run.stderr and "has no `reference`" in run.stderr


def test_inconclusive_exits_2(tiny_root: Path) -> None:
    run = shardproof("verify", "--project", str(tiny_root), "--check", "unsupported-op", "--json")
    assert run.returncode == 2
    payload = json.loads(run.stdout)
    assert payload["checks"][0]["world_sizes"][0]["inconclusive"][0]["op"] == "tinymlp::log_gamma"


def test_json_carries_the_numeric_witness(tmp_path: Path) -> None:
    import bug_variants

    project = bug_variants.materialize(bug_variants.variant("all-reduce-twice"), tmp_path / "variant")
    run = shardproof("verify", "--project", str(project), "--world-size", "2", "--json")
    assert run.returncode == 1, run.stderr
    (world_size,) = json.loads(run.stdout)["checks"][0]["world_sizes"]
    witness = world_size["discrepancies"][0]["witness"]
    assert witness["status"] == "confirmed" and witness["world_size"] == 2
    (output,) = witness["outputs"]
    assert output["where"] == "output 0" and output["max_rel"] > witness["tolerance"]
    assert witness["at_module"]["where"] == "layers.0.attention.wo"
    assert witness["at_module"]["max_rel"] > witness["tolerance"]  # the duplicated reduction doubles it
    assert "witness" in world_size["seconds"]


def test_one_process_at_a_time_gives_the_same_results(example_root: Path) -> None:
    def outcome(*flags: str) -> list[tuple]:
        # every layer traced (--no-memoize): the world size is verified in parts, saturated at once
        run = shardproof(
            "verify", "--json", "--check", "llama-sp", "--world-size", "4", "--no-memoize", *flags, cwd=example_root
        )
        assert run.returncode == 0, run.stderr
        (check,) = json.loads(run.stdout)["checks"]
        return [(w["verdict"], w["summary"], w["stats"].get("parts")) for w in check["world_sizes"]]

    parallel = outcome()
    assert outcome("--jobs", "1") == parallel and [(verdict, parts) for verdict, _, parts in parallel] == [
        ("verified", 5)
    ]
    assert shardproof("verify", "--jobs", "0", cwd=example_root).returncode == 2


def test_unproven_exit_code_json_sarif_and_fail_on(tiny_root: Path, tmp_path: Path) -> None:
    """A correct program the rules cannot prove yet (an all-reduce spelled as an all-gather and a
    running sum): exit code 3,
    `unproven` in JSON with the witness's trials, a SARIF warning, and `--fail-on discrepancy`
    lets it pass."""
    sarif_path = tmp_path / "out.sarif"
    run = shardproof("verify", "--check", "gathered-sum", "--json", "--sarif", str(sarif_path), cwd=tiny_root)
    assert run.returncode == 3, run.stderr
    payload = json.loads(run.stdout)
    assert payload["exit_code"] == 3
    (check,) = payload["checks"]
    (world,) = check["world_sizes"]
    assert check["verdict"] == world["verdict"] == "unproven" and world["discrepancies"] == []
    (finding,) = world["unproven"]
    assert finding["primary"]["file"].endswith("tinymlp/parallel.py")
    assert finding["witness"]["status"] == "agree" and len(finding["witness"]["trials"]) >= 6
    assert {t["seed"] for t in finding["witness"]["trials"]} == {0, 1, 2}
    assert not any(t["differs"] for t in finding["witness"]["trials"])
    (result,) = json.loads(sarif_path.read_text())["runs"][0]["results"]
    assert (result["ruleId"], result["level"]) == ("unproven", "warning")
    text = shardproof("verify", "--check", "gathered-sum", "--fail-on", "discrepancy", cwd=tiny_root)
    assert text.returncode == 0, text.stderr
    assert "gathered-sum: ⚠ unproven" in text.stdout and "witness:   no difference found" in text.stdout
    strict = shardproof("verify", "--check", "gathered-sum", "--fail-on", "unproven", cwd=tiny_root)
    assert strict.returncode == 3


def test_help_names_the_verdicts_and_exit_codes() -> None:
    run = shardproof("verify", "--help")
    assert run.returncode == 0
    for text in ("⚠ unproven", "✘ discrepancy", "exit codes:", "3  unproven", "--fail-on LEVEL"):
        assert text in run.stdout, text
