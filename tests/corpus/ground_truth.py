"""Numeric ground truth for a corpus: each check's reference and its ranks run for real, one OS
process per rank on a gloo process group, in float64 on random weights (three seeds) and on the
example inputs and a random draw; every rank's output must equal the reference's (a DTensor
output as its full tensor; with `outputs = "sharded"`, an output smaller than the reference's in
one dimension as the rank's chunk of it).

    python tests/corpus/ground_truth.py [--corpus unusual|frameworks] [--write] [NAME ...]

prints each check and world size with the largest relative error; `--write` records them in
<corpus>/GROUND_TRUTH.json (what the tests read).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "unusual"  # the default corpus; every function takes another one's directory
RECORD = CORPUS / "GROUND_TRUTH.json"
SEEDS = (0, 1, 2)


def record_path(corpus: Path = CORPUS) -> Path:
    return corpus / "GROUND_TRUTH.json"


def _load(spec: str):
    module, name = spec.split(":")
    __import__(module)
    return getattr(sys.modules[module], name)


def _rank(rank: int, world_size: int, check: dict, store: str, out: str, corpus: Path) -> None:
    sys.path.insert(0, str(corpus))
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    build, parallel, inputs = (_load(check[k]) for k in ("reference", "parallel", "inputs"))
    worst = 0.0
    try:
        for seed in SEEDS:
            torch.manual_seed(seed)
            reference = build().eval()
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for parameter in reference.parameters():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
            example = inputs()
            draws = [example, tuple(_like(t, generator) for t in example)]
            model = parallel(copy.deepcopy(reference), rank, world_size).eval()
            with torch.no_grad():
                for args in draws:
                    found, expected = _aligned(model(*args), reference(*args), rank, check.get("outputs"))
                    scale = max(expected.abs().max().item(), 1e-12)
                    worst = max(worst, (found - expected).abs().max().item() / scale)
        Path(out, f"{rank}.json").write_text(json.dumps({"max_rel": worst}))
    finally:
        dist.destroy_process_group()
    # the numbers are written: skip the interpreter's teardown, where a thread torch left running
    # could end the process with SIGABRT ("terminate called without an active exception", seen
    # under load) after the run itself succeeded
    os._exit(0)


def _aligned(found, expected: torch.Tensor, rank: int, outputs: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's output and what it must equal: a DTensor by its full value; under `sharded`
    outputs (or none declared, the same default), an output smaller than the reference's in one
    dimension is the rank's block of that dimension."""
    from torch.distributed.tensor import DTensor

    if isinstance(found, DTensor):
        found = found.full_tensor()
    if found.shape == expected.shape or outputs not in (None, "sharded"):
        return found, expected
    (dim,) = [d for d in range(expected.dim()) if found.shape[d] != expected.shape[d]]
    return found, expected.narrow(dim, rank * found.shape[dim], found.shape[dim])


def _like(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if tensor.is_floating_point():
        return torch.randn(tensor.shape, generator=generator)
    return torch.randint(0, int(tensor.max()) + 1, tensor.shape, generator=generator)


def checks(corpus: Path = CORPUS) -> list[dict]:
    import tomllib

    return tomllib.loads((corpus / "pyproject.toml").read_text())["tool"]["shardproof"]["check"]


def run(check: dict, world_size: int, corpus: Path = CORPUS) -> float:
    """The largest relative error of any rank's output, over every seed and input."""
    with tempfile.TemporaryDirectory() as scratch:
        store, out = os.path.join(scratch, "store"), os.path.join(scratch, "out")
        os.mkdir(out)
        args = (world_size, check, store, out, corpus)
        # spawned, not forked: a process that already ran torch (a test session, its verifier
        # threads) can hold a thread-pool lock at fork, and its forked ranks then wait forever
        try:
            mp.start_processes(_rank, args=args, nprocs=world_size, start_method="spawn")
        except mp.ProcessExitedException:
            # a rank that ended abnormally after every rank wrote its numbers ended in teardown
            if not all(Path(out, f"{r}.json").exists() for r in range(world_size)):
                raise
        return max(json.loads(Path(out, f"{r}.json").read_text())["max_rel"] for r in range(world_size))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=CORPUS.name, help="the corpus directory under tests/corpus")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    corpus = HERE / args.corpus
    record_file = record_path(corpus)
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    for check in checks(corpus):
        if args.names and check["name"] not in args.names:
            continue
        for world_size in check["world-sizes"]:
            error = run(check, world_size, corpus)
            record.setdefault(check["name"], {})[str(world_size)] = {"agree": error <= 1e-9, "max_rel": error}
            print(f"{check['name']} @ {world_size}: max relative error {error:.2g}")
    if args.write:
        record_file.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
