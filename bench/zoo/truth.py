"""Numeric ground truth for one zoo model at one world size, as tests/corpus/ground_truth.py
establishes it: the reference and every rank run for real, one OS process per rank (forked) on a
gloo process group, on random weights (three seeds) and on the example inputs and a random draw;
each rank's output is compared with the reference's. float64 first; a model whose kernels refuse
float64 (transformers' grouped-matmul experts) runs in float32."""

from __future__ import annotations

import copy
import json
import os
import tempfile
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import models

SEEDS = (0, 1, 2)
TOLERANCE = {"float64": 1e-6, "float32": 1e-4}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _draws(generator: torch.Generator) -> list[tuple[torch.Tensor, ...]]:
    example = models.example_inputs()
    return [example, (torch.randint(0, models.HIGHEST_EXAMPLE_ID, example[0].shape, generator=generator),)]


def _rank(rank: int, world_size: int, name: str, dtype_name: str, store: str, out: str) -> None:
    dtype = getattr(torch, dtype_name)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    worst, stage = 0.0, "building the reference"
    try:
        for seed in SEEDS:
            torch.manual_seed(seed)
            reference = models.build(name).to(dtype)
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for parameter in reference.parameters():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=dtype) * 0.3)
            draws = _draws(generator)
            stage = "running the reference"
            with torch.no_grad():
                expected = [reference(*args) for args in draws]
            stage = "distributing the model with its plan"
            model = models.distribute(copy.deepcopy(reference), world_size)
            stage = "running the ranks"
            with torch.no_grad():
                for args, want in zip(draws, expected, strict=True):
                    found = _full(model(*args))
                    scale = max(want.abs().max().item(), 1e-12)
                    worst = max(worst, (found.to(want.dtype) - want).abs().max().item() / scale)
    except BaseException as exc:
        # the record first: the failure ends the other ranks (they may wait in a collective)
        Path(out, f"{rank}.json").write_text(json.dumps({"error": _describe(exc), "stage": stage}))
        raise
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps({"max_rel": worst}))


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    first_line = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {first_line} ({Path(last.filename).name}:{last.lineno})"


def _run(name: str, world_size: int, dtype_name: str) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        store, out = os.path.join(scratch, "store"), os.path.join(scratch, "out")
        os.mkdir(out)
        try:
            mp.start_processes(
                _rank, args=(world_size, name, dtype_name, store, out), nprocs=world_size, start_method="fork"
            )
        except mp.ProcessRaisedException:
            pass  # the rank wrote its error
        except mp.ProcessExitedException as exc:
            return {"dtype": dtype_name, "error": f"a rank exited: {exc}", "stage": "running the ranks"}
        records = [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"))]
    failures = [r for r in records if "error" in r]
    if failures:
        return {"dtype": dtype_name, **failures[0]}
    worst = max(r["max_rel"] for r in records)
    return {"dtype": dtype_name, "max_rel": worst, "agree": worst <= TOLERANCE[dtype_name]}


def ground_truth(name: str, world_size: int) -> dict:
    """{"dtype", "max_rel", "agree"}, or {"dtype", "error", "stage"} when the run itself raises."""
    truth = _run(name, world_size, "float64")
    if "error" in truth:
        in_float32 = _run(name, world_size, "float32")
        if "error" not in in_float32:
            return {**in_float32, "float64_error": truth["error"]}
    return truth
