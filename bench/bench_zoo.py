"""The transformers zoo: every config class of the installed transformers with a built-in
tensor-parallel plan (`base_model_tp_plan`), built tiny (bench/zoo/models.py), distributed the way
`from_pretrained(..., tp_plan="auto")` does, verified by shardproof at each world size, and run
for real on gloo for the truth. Each (model, world size) is classified: verified-equal,
discrepancy-different, false-alarm, false-verified, unproven, unproven-different, inconclusive,
error, setup-failure or timeout (bench/zoo/run.py).

    python bench/bench_zoo.py [--world-sizes 2 4] [--only NAME ...] [--limit N] [--jobs 1]
                              [--timeout 300] [--results bench/zoo/results.json] [--resume]

Each (model, world size) runs in its own subprocess (its own session, killed at the timeout), so a
crash or a hang never stops the sweep. Results are merged into the JSON as they come (a rerun of
some models keeps the others'); the markdown table and the counts go to stdout.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_RESULTS = HERE / "zoo" / "results.json"
MACHINE = "2-core CPU (Intel Xeon), torch {torch}, transformers {transformers}, Python {python}"


def _worker(name: str, world_size: int, out: Path) -> None:
    """The subprocess: one model at one world size, its record (and checkpoints) written to `out`."""
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("SHARDPROOF_CACHE_DIR", "off")  # every model verified from scratch
    from zoo.run import measure

    def checkpoint(record: dict) -> None:
        out.write_text(json.dumps(record, indent=2))

    with tempfile.TemporaryDirectory(prefix="zoo-") as scratch:
        record = measure(name, world_size, Path(scratch), checkpoint=checkpoint)
    record.pop("stage", None)
    checkpoint(record)


def _run_one(name: str, world_size: int, timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    command = [sys.executable, __file__, "--worker", name, "--world-size", str(world_size), "--out", str(out)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the worker and its gloo ranks
        _, stderr = process.communicate()
        timed_out = True
    seconds = time.perf_counter() - started
    try:
        record = json.loads(out.read_text() or "{}")
    except json.JSONDecodeError:
        record = {}
    out.unlink(missing_ok=True)
    record.update(name=name, world_size=world_size, seconds=round(seconds, 1))
    if timed_out:
        record["class"] = "timeout"
        record["reason"] = f"no result within {timeout:.0f} s (while {record.pop('stage', 'starting')})"
    elif "class" not in record:
        lines = stderr.decode(errors="replace").strip().splitlines()
        record["class"] = "setup-failure" if "shardproof" not in record else "error"
        record["reason"] = f"the worker died (exit {process.returncode}): {lines[-1] if lines else 'no output'}"
        record.pop("stage", None)
    return record


def _done(data: dict, name: str, world_size: int) -> bool:
    record = data["results"].get(name, {}).get(str(world_size))
    return record is not None and record["class"] != "timeout"


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"results": {}}


# an error message names the files of this machine's environment: kept from site-packages on
_INSTALL_PREFIX = re.compile(r"/[^\s'\"]*?/site-packages/")


def _save(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    path.write_text(_INSTALL_PREFIX.sub("site-packages/", text))


def _machine() -> str:
    import torch
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return MACHINE.format(python=platform.python_version(), **versions)


def _detail(record: dict) -> str:
    """What the table says about one record besides its class."""
    verdict = record.get("shardproof", {})
    if record["class"] in ("setup-failure", "timeout"):
        return record.get("reason", "")
    if record["class"] == "inconclusive":
        return _stopped_at(record)
    if record["class"] in ("discrepancy-different", "false-alarm", "unproven", "unproven-different", "error"):
        finding = verdict.get("discrepancy") or verdict.get("unproven") or {}
        kind = f"[{finding['kind']}] " if finding.get("kind") else ""
        return f"{kind}{verdict.get('message', '')}"[:240]
    return ""


def _stopped_at(record: dict) -> str:
    """The operation an inconclusive verdict stops at, else its reason (a bound, a panic)."""
    finding = record.get("shardproof", {}).get("inconclusive", {})
    if finding.get("op"):
        return f"`{finding['op']}`"
    return f"{finding.get('kind') or 'bound'}: {(finding.get('message') or '')[:120]}"


def report(data: dict, world_sizes: list[int]) -> str:
    """The markdown table (one row per model) and the counts per world size."""
    results = data["results"]
    lines = [f"Machine: {data['machine']}. {data.get('duration', '')}", ""]
    header = "| model | MoE | " + " | ".join(f"world size {w}" for w in world_sizes) + " | max rel. error | notes |"
    lines += [header, "|" + "---|" * (len(world_sizes) + 4)]
    for name in sorted(results):
        by_size = results[name]
        records = [by_size.get(str(w)) for w in world_sizes]
        moe = next((r["model"].get("moe") for r in records if r and r.get("model", {}).get("ok")), None)
        errors = [f"{r['truth']['max_rel']:.1e}" for r in records if r and "max_rel" in r.get("truth", {})]
        notes = "; ".join(dict.fromkeys(_detail(r) for r in records if r and _detail(r)))
        cells = [r["class"] if r else "—" for r in records]
        moe_cell = {True: "yes", False: "no"}.get(moe, "?")
        lines.append(f"| {name} | {moe_cell} | " + " | ".join(cells) + f" | {', '.join(errors)} | {notes} |")
    lines.append("")
    for world_size in world_sizes:
        counts = collections.Counter(r[str(world_size)]["class"] for r in results.values() if str(world_size) in r)
        summary = ", ".join(f"{cls} {n}" for cls, n in counts.most_common())
        lines.append(f"World size {world_size} ({sum(counts.values())} models): {summary}")
    ops = collections.Counter(
        _stopped_at(r) for by_size in results.values() for r in by_size.values() if r["class"] == "inconclusive"
    )
    if ops:
        lines.append("Inconclusive at: " + ", ".join(f"{op} ({n})" for op, n in ops.most_common()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="config class names (globs)")
    parser.add_argument("--limit", type=int, default=None, help="the first N models only")
    parser.add_argument("--jobs", type=int, default=1, help="models measured at once")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per model and world size")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--report-only", action="store_true", help="print the table of the recorded results")
    parser.add_argument("--resume", action="store_true", help="skip what the results already hold (but timeouts)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.world_size, args.out)
        return
    data = _load(args.results)
    if not args.report_only:
        sys.path.insert(0, str(HERE))
        from zoo.models import zoo_names

        names = zoo_names()
        if args.only:
            names = [n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in args.only)]
        names = names[: args.limit] if args.limit else names
        data["machine"] = _machine()
        data["zoo_size"] = len(zoo_names())
        jobs = [(name, w) for name in names for w in args.world_sizes if not (args.resume and _done(data, name, w))]
        started = time.perf_counter()
        with ThreadPoolExecutor(args.jobs) as pool:
            for record in pool.map(lambda job: _run_one(*job, args.timeout), jobs):
                data["results"].setdefault(record["name"], {})[str(record["world_size"])] = record
                _save(args.results, data)
                where = f"{record['name']} @ {record['world_size']}"
                print(f"{where}: {record['class']} ({record['seconds']} s)", file=sys.stderr)
        minutes = (time.perf_counter() - started) / 60
        runs = f"{len(jobs)} runs ({len(names)} models)"
        data["duration"] = f"Last sweep: {runs} in {minutes:.0f} min, --jobs {args.jobs}."
        _save(args.results, data)
    print(report(data, args.world_sizes))


if __name__ == "__main__":
    main()
