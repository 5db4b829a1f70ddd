"""Scale: the Llama-3.1-405B architecture at tensor-parallel size 8, on meta tensors.

The bundled example's model (`examples/llama`) and its Megatron-style tensor-parallel version,
with the 405B configuration: 126 layers, hidden 16384, 128 attention heads, 8 KV heads,
intermediate 53248, vocabulary 128256. Every run is `shardproof verify --json` in a fresh process
(end-to-end wall time: import, capture, verification), so its peak RSS is the process's own
(plus the saturation's child process, reported apart).

    python bench/bench_scale.py                 # every table, median of 3 runs
    python bench/bench_scale.py --only 405b --runs 1

Runs are cold (the cache off) except the warm table's: cold, again unchanged, and after an edit of
the parallel code, with a cache of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = """
import os

from llama_example.model import Llama, LlamaConfig, example_inputs

CONFIG = LlamaConfig(
    vocab_size=int(os.environ["SCALE_VOCAB"]),
    dim=int(os.environ["SCALE_DIM"]),
    n_layers=int(os.environ["SCALE_LAYERS"]),
    n_heads=int(os.environ["SCALE_HEADS"]),
    n_kv_heads=int(os.environ["SCALE_KV_HEADS"]),
    ffn_dim=int(os.environ["SCALE_FFN"]),
    max_seq_len=64,
)


def build():
    return Llama(CONFIG)


def inputs():
    return example_inputs(CONFIG)
"""
LLAMA_405B = {"vocab": 128256, "dim": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248}
# GraphGuard's GPT workload shape (8 layers at TP=8): a GPT-3 XL-sized decoder in the example's style
GPT_8_LAYERS = {"vocab": 50304, "dim": 2048, "heads": 16, "kv_heads": 16, "ffn": 8192}


def write_project(root: Path, checks: tuple[str, ...] = ("tp", "sp")) -> None:
    """The scale project at `root`, declaring `checks` (of "tp", "sp")."""
    (root / "scale_model").mkdir(parents=True, exist_ok=True)
    (root / "scale_model" / "__init__.py").write_text("")
    (root / "scale_model" / "model.py").write_text(MODEL)
    # a copy of the example's code, which the warm table edits
    example_copy = root / "example"
    shutil.copytree(ROOT / "examples" / "llama", example_copy, ignore=shutil.ignore_patterns("__pycache__"))
    example = example_copy.as_posix()
    parallel = {"tp": "llama_example.tp:parallelize", "sp": "llama_example.sp:parallelize"}
    declared = "".join(
        textwrap.dedent(f"""
        [[tool.shardproof.check]]
        name = "{name}"
        reference = "scale_model.model:build"
        parallel = "{parallel[name]}"
        inputs = "scale_model.model:inputs"
        world-sizes = [8]
        outputs = "replicated"
        """)
        for name in checks
    )
    (root / "pyproject.toml").write_text(f'\n[tool.shardproof]\npython-path = [".", "{example}"]\n{declared}')


def run(
    project: Path,
    shape: dict[str, int],
    layers: int,
    world_size: int,
    flags: tuple[str, ...] = (),
    check: str = "tp",
    cache: Path | None = None,
) -> dict[str, object]:
    env = dict(os.environ, SHARDPROOF_CACHE_DIR=str(cache) if cache else "off")
    env.update({f"SCALE_{k.upper()}": str(v) for k, v in shape.items()})
    env["SCALE_LAYERS"] = str(layers)
    command = [sys.executable, "-m", "shardproof", "verify", "--project", str(project), "--json"]
    command += ["--check", check, "--world-size", str(world_size), *flags]
    start = time.perf_counter()
    before_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = before_usage.ru_maxrss
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = usage.ru_maxrss
    # processor time of the run and every process it waited for (the forked capture processes, the
    # saturation processes): less sensitive than wall time to other work on a shared machine
    cpu = (usage.ru_utime + usage.ru_stime) - (before_usage.ru_utime + before_usage.ru_stime)
    report = json.loads(done.stdout)
    (outcome,) = report["checks"][0]["world_sizes"]
    return {
        "wall": wall,
        "cpu": cpu,
        "verdict": outcome["verdict"],
        "capture": outcome["seconds"].get("capture", 0.0),
        "verification": outcome["seconds"].get("verification", 0.0),
        "templates": outcome.get("stats", {}).get("templates"),
        "parts": outcome.get("stats", {}).get("parts"),
        "reused": bool(outcome.get("stats", {}).get("reused")),
        "cached_units": outcome.get("stats", {}).get("cached_units"),
        # ru_maxrss of children is the largest child so far: a lower bound when an earlier run was larger
        "peak_gib": max(peak, before) / (1 << 20),
    }


def median_of(runs: int, *args: object) -> dict[str, object]:
    results = [run(*args) for _ in range(runs)]  # type: ignore[arg-type]
    median = dict(results[0])
    for key in ("wall", "cpu", "capture", "verification"):
        median[key] = statistics.median(float(r[key]) for r in results)  # type: ignore[arg-type]
    median["peak_gib"] = max(float(r["peak_gib"]) for r in results)  # type: ignore[arg-type]
    return median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["405b", "layers", "world", "gpt", "plain", "jobs", "warm"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "scale"
        write_project(project)
        tables: list[tuple[str, list[tuple[str, dict[str, object]]]]] = []
        if args.only in (None, "405b"):
            rows = [("126 layers, TP=8", median_of(args.runs, project, LLAMA_405B, 126, 8))]
            tables.append(("Llama-3.1-405B architecture at TP=8 (end to end)", rows))
        if args.only in (None, "layers"):
            rows = [(f"{n} layers", median_of(args.runs, project, LLAMA_405B, n, 8)) for n in (2, 8, 32, 126)]
            tables.append(("405B shape at TP=8, by number of layers", rows))
        if args.only in (None, "world"):
            rows = [(f"TP={w}", median_of(args.runs, project, LLAMA_405B, 2, w)) for w in (2, 4, 8, 16, 32, 64)]
            tables.append(("405B shape, 2 layers, by tensor-parallel size", rows))
        if args.only in (None, "gpt"):
            rows = [
                ("8 layers, TP=8", median_of(args.runs, project, GPT_8_LAYERS, 8, 8)),
                ("8 layers, TP=8 + sequence parallel", median_of(args.runs, project, GPT_8_LAYERS, 8, 8, (), "sp")),
            ]
            tables.append(("GraphGuard's workload shape: a GPT-style decoder, 8 layers, TP=8", rows))
        if args.only in (None, "plain"):
            rows = []
            for n in (2, 8):
                rows.append((f"{n} layers, blocks memoized", median_of(args.runs, project, LLAMA_405B, n, 8)))
                every = ("--no-memoize",)
                rows.append(
                    (f"{n} layers, every layer, in parts", median_of(args.runs, project, LLAMA_405B, n, 8, every))
                )
                whole = (*every, "--no-partition")
                rows.append((f"{n} layers, every layer, whole", median_of(args.runs, project, LLAMA_405B, n, 8, whole)))
            tables.append(("Memoized, in parts and whole, 405B shape at TP=8", rows))
        if args.only in (None, "jobs"):
            # every layer traced (`--no-memoize`), so the world size is verified in parts: what the
            # jobs share (sequence-parallel blocks are otherwise memoized, two units)
            rows = []
            for jobs in (1, 2):
                flags = ("--jobs", str(jobs), "--no-memoize")
                rows.append(
                    (f"8 layers, SP, --jobs {jobs}", median_of(args.runs, project, LLAMA_405B, 8, 8, flags, "sp"))
                )
            title = "Parts saturated one at a time and two at once (2 cores), 405B shape, TP=8 + SP, every layer traced"
            tables.append((title, rows))
        if args.only in (None, "warm"):
            # one run each: the second and third depend on the first's cache
            cache = Path(tmp) / "cache"
            rows = [("cold", run(project, LLAMA_405B, 126, 8, cache=cache))]
            rows.append(("warm (nothing changed)", run(project, LLAMA_405B, 126, 8, cache=cache)))
            parallel = project / "example" / "llama_example" / "tp.py"
            parallel.write_text(parallel.read_text() + "\n# an edit\n")
            rows.append(("after editing tp.py (a comment)", run(project, LLAMA_405B, 126, 8, cache=cache)))
            tables.append(("Warm and incremental, 405B at TP=8 (one run each)", rows))
    # the row each table's ratios are taken against
    baselines = {
        "405B shape at TP=8, by number of layers": "2 layers",
        "405B shape, 2 layers, by tensor-parallel size": "TP=8",
    }
    for title, rows in tables:
        print(f"\n{title}\n")
        print(
            "| configuration | verdict | wall time | processor time | capture | verification | distinct blocks "
            "| parts | reused | peak RSS |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        base = dict(rows).get(baselines.get(title, ""))
        for label, r in rows:
            if r["reused"]:
                reused, capture, verification = "the whole result", "-", "-"
            else:
                reused = f"{r['cached_units']} units" if r["cached_units"] else "-"
                capture, verification = f"{float(r['capture']):.1f} s", f"{float(r['verification']):.2f} s"  # type: ignore[arg-type]
            print(
                f"| {label} | {r['verdict']} | {float(r['wall']):.1f} s | {float(r['cpu']):.1f} s "  # type: ignore[arg-type]
                f"| {capture} | {verification} | "
                f"{r['templates'] if r['templates'] is not None else '-'} | "
                f"{r['parts'] if r['parts'] is not None else '-'} | {reused} | "
                f"{float(r['peak_gib']):.2f} GiB |"  # type: ignore[arg-type]
            )
        if base is not None:
            print(f"\nratios against {baselines[title]} (wall time, processor time, capture):")
            for label, r in rows:
                wall, cpu, capture = (
                    float(r[key]) / max(float(base[key]), 1e-9)  # type: ignore[arg-type]
                    for key in ("wall", "cpu", "capture")
                )
                print(f"  {label}: {wall:.2f}x, {cpu:.2f}x, {capture:.2f}x")


if __name__ == "__main__":
    main()
