"""A fixed sample of the transformers zoo (bench/bench_zoo.py): tiny Hugging Face models, dense and
mixture of experts, distributed with their built-in tensor-parallel plan at world size 2 and
verified through the zoo's own code path (a generated project per model, `verify_check`).

Whatever the verdict, two safety properties must hold against the numeric truth of a real gloo
run: shardproof never calls a model verified whose ranks compute something else
(false-verified), and never shows a discrepancy where the numbers agree (false alarm). The truth
is read from the recorded sweep (bench/zoo/results.json); one model's gloo run is rerun live to
check that the record still describes this transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RECORD = BENCH / "zoo" / "results.json"
WORLD_SIZE = 2

DENSE = [
    "LlamaConfig",
    "MistralConfig",
    "Qwen2Config",
    "Qwen3Config",
    "Gemma2Config",
    "ApertusConfig",
    "OlmoConfig",
    "GraniteConfig",
    "Phi3Config",  # an empty slice after its gathers once crashed the relayout
]
MIXTURE_OF_EXPERTS = [
    "MixtralConfig",
    "Qwen3MoeConfig",
    "OlmoeConfig",
    "DeepseekV3Config",
    "AXK2Config",  # a key shared by every head: once an unsound union (egglog's illegal merge of shapes)
]
SAMPLE = DENSE + MIXTURE_OF_EXPERTS
LIVE = "Qwen3MoeConfig"  # float64 refused by its experts: the float32 fallback runs too

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="module")
def recorded() -> dict:
    results = json.loads(RECORD.read_text())["results"]
    missing = [name for name in SAMPLE if "truth" not in results.get(name, {}).get(str(WORLD_SIZE), {})]
    assert not missing, f"no recorded ground truth for {missing}: run python bench/bench_zoo.py --only {missing}"
    return {name: results[name][str(WORLD_SIZE)] for name in SAMPLE}


def test_the_sample_runs_for_real(recorded: dict) -> None:
    """Every sampled model builds, distributes and runs on gloo, and its ranks agree with the
    reference: the sample holds no upstream bug that would hide a false alarm."""
    for name, record in recorded.items():
        assert "error" not in record["truth"], (name, record["truth"])
        assert record["truth"]["agree"], (name, record["truth"])


def test_live_ground_truth_matches_the_record(recorded: dict) -> None:
    # a fresh interpreter: the gloo ranks are forked, and forking this process (the sandbox's
    # threads, torch's thread pools) could hang them
    code = (
        f"import json, sys; from zoo.truth import ground_truth; print(json.dumps(ground_truth({LIVE!r}, {WORLD_SIZE})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, timeout=300, check=True
    )
    live = json.loads(done.stdout.strip().splitlines()[-1])
    expected = recorded[LIVE]["truth"]
    assert "error" not in live, live
    assert (live["dtype"], live["agree"]) == (expected["dtype"], expected["agree"]), (live, expected)


@pytest.mark.parametrize("name", SAMPLE)
def test_zoo_model_is_neither_falsely_verified_nor_falsely_alarmed(
    name: str, recorded: dict, sandbox, tmp_path: Path
) -> None:
    from zoo.run import measure

    record = measure(name, WORLD_SIZE, tmp_path, sandbox, truth=dict(recorded[name]["truth"]))
    verdict = record.get("shardproof", {})
    assert record["class"] != "false-verified", (name, verdict)
    assert record["class"] != "false-alarm", (name, verdict)
    assert record["class"] not in ("setup-failure", "error"), (name, record.get("reason"), verdict)
    # every model of the sample is correct and proven today: a regression shows here first
    assert record["class"] == "verified-equal", (name, verdict)
