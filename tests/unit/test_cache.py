"""The on-disk cache of saturations: a hit only for the very same unit under the same rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.verify import cache
from shardproof.verify.engine import Facts, Saturation
from shardproof.verify.sandbox import Job


class CountingSandbox:
    def __init__(self, status: str = "fixpoint") -> None:
        self.calls = 0
        self.status = status

    def saturate_all(self, jobs: list[Job]) -> list[Saturation]:
        self.calls += len(jobs)
        facts = Facts(classes={"reference/out": 0, "rank0/out": 0})
        return [Saturation(self.status, 3, 0.5, 42, facts=facts) for _ in jobs]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_same_unit_is_saturated_once(cache_dir: Path) -> None:
    box = CountingSandbox()
    first, hit_first = cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    second, hit_second = cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    assert (hit_first, hit_second, box.calls) == (False, True, 1)
    assert second.facts is not None and second.facts.classes == first.facts.classes
    assert second.rows == 42


def test_changed_commands_bounds_or_rules_miss(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = CountingSandbox()
    cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    _, changed_code = cache.saturate(box, ['(let a (Input "1"))'], 10, 5.0, 1000)
    _, changed_bound = cache.saturate(box, ['(let a (Input "0"))'], 11, 5.0, 1000)
    # a rule's text changed, whether or not the library's version number was bumped
    from shardproof.verify import rules

    program = rules.program_text()
    monkeypatch.setattr(rules, "program_text", lambda: program.replace("partial-whole-range", "partial-whole-range2"))
    cache._rule_library.cache_clear()
    _, changed_rules = cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    cache._rule_library.cache_clear()
    assert (changed_code, changed_bound, changed_rules) == (False, False, False)
    assert box.calls == 4


def test_a_result_that_depends_on_the_machine_is_not_kept(cache_dir: Path) -> None:
    box = CountingSandbox(status="time-limit")
    cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    _, hit = cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    assert not hit and box.calls == 2


def test_a_damaged_entry_is_computed_again(cache_dir: Path) -> None:
    box = CountingSandbox()
    cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    for entry in (cache_dir / "units").iterdir():
        entry.write_text("{not json")
    _, hit = cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    assert not hit and box.calls == 2


def test_the_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", "off")
    box = CountingSandbox()
    cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    _, hit = cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    assert not hit and box.calls == 2


def test_of_several_units_only_those_the_cache_lacks_are_saturated(cache_dir: Path) -> None:
    box = CountingSandbox()
    cache.saturate(box, ['(let a (Input "0"))'], 10, 5.0, 1000)
    jobs = [Job(['(let a (Input "0"))'], 10, 5.0, 1000), Job(['(let a (Input "1"))'], 10, 5.0, 1000)]
    results = cache.saturate_all(box, jobs)
    assert [cached for _, cached in results] == [True, False]
    assert box.calls == 2


def test_two_copies_of_a_project_keep_their_own_results(tmp_path: Path) -> None:
    """A stored report names files and lines: a copy of the project (a worktree, a bug variant)
    that declares the same check must not be served the original's report."""
    import shutil

    from shardproof.config import load_project
    from shardproof.pipeline import stored_result_key

    original = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"
    copy = tmp_path / "tiny-copy"
    shutil.copytree(original, copy)
    keys = []
    for root in (original, copy):
        project = load_project(root)
        keys.append(stored_result_key(project.check("ok"), project, 2, "memoize=False partition=True"))
    assert keys[0] != keys[1]
    project = load_project(original)
    assert keys[0] == stored_result_key(project.check("ok"), project, 2, "memoize=False partition=True")
