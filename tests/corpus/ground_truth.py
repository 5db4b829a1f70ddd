"""Numeric ground truth for the corpus: each check's reference and its ranks run for real, one OS
process per rank on a gloo process group, in float64 on random weights (three seeds) and on the
example inputs and a random draw; every rank's output must equal the reference's.

    python tests/corpus/ground_truth.py [--write] [NAME ...]

prints each check and world size with the largest relative error; `--write` records them in
unusual/GROUND_TRUTH.json (what the tests read).
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
CORPUS = HERE / "unusual"
RECORD = CORPUS / "GROUND_TRUTH.json"
SEEDS = (0, 1, 2)


def _load(spec: str):
    module, name = spec.split(":")
    __import__(module)
    return getattr(sys.modules[module], name)


def _rank(rank: int, world_size: int, check: dict, store: str, out: str) -> None:
    sys.path.insert(0, str(CORPUS))
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
                    expected, found = reference(*args), model(*args)
                    scale = max(expected.abs().max().item(), 1e-12)
                    worst = max(worst, (found - expected).abs().max().item() / scale)
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps({"max_rel": worst}))


def _like(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if tensor.is_floating_point():
        return torch.randn(tensor.shape, generator=generator)
    return torch.randint(0, int(tensor.max()) + 1, tensor.shape, generator=generator)


def checks() -> list[dict]:
    import tomllib

    return tomllib.loads((CORPUS / "pyproject.toml").read_text())["tool"]["shardproof"]["check"]


def run(check: dict, world_size: int) -> float:
    """The largest relative error of any rank's output, over every seed and input."""
    with tempfile.TemporaryDirectory() as scratch:
        store, out = os.path.join(scratch, "store"), os.path.join(scratch, "out")
        os.mkdir(out)
        mp.start_processes(_rank, args=(world_size, check, store, out), nprocs=world_size, start_method="fork")
        return max(json.loads(Path(out, f"{r}.json").read_text())["max_rel"] for r in range(world_size))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for check in checks():
        if args.names and check["name"] not in args.names:
            continue
        for world_size in check["world-sizes"]:
            error = run(check, world_size)
            record.setdefault(check["name"], {})[str(world_size)] = {"agree": error <= 1e-9, "max_rel": error}
            print(f"{check['name']} @ {world_size}: max relative error {error:.2g}")
    if args.write:
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
