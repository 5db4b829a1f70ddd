"""The numeric witness of the "same code at world size 1" pattern: every rank in its own process.

fairscale and Megatron-core keep their model-parallel groups in module globals, so their ranks
cannot share one process as threads (`numeric.py`). Here a host process imports the user's code
once and forks one child per rank; the children talk over a real gloo process group (files in a
temporary directory as the rendezvous), so the libraries' collectives run unchanged.

Each child first plays the reference: the same builder under a one-rank group, in the run's dtype,
with each seed's random weights, run on every input trial of that seed. It then becomes its rank
of the `world_size`-rank group, builds the model again and, for each seed, gives every parameter
and buffer its value from the reference's tensor of the same name (the relation the static proof
assumes: same shape is the same tensor, one dim `world_size` times smaller is the rank's
contiguous block, declarations first) and runs the same trials.

The host gathers what the children computed into one file the
caller reads back; the comparison itself is `numeric.compare_runs`, shared with the threaded run.

Forking happens before any computation, from a process that has only imported modules, so no
thread pool is copied into the children.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from ..config import Check, Project, declared_shard, load_project, same_code_sharded_dim
from . import numeric
from .compare import tolerance_of
from .numeric import (
    NumericComparison,
    NumericRunError,
    RankFailure,
    RelationOverride,
    RunTimedOut,
    compare_runs,
    default_dtype,
    harness_failure,
    hook_module,
    in_dtypes,
    load_declared_values,
    randomize,
    refuse_large,
    run_reference,
    to_dtype,
)
from .trials import SEEDS, input_trials

# Importing torch and the libraries (Megatron-core takes ~5 s) in the host comes on top of the run.
HOST_STARTUP_SECONDS = 60.0
# After a rank failed, how long the others may still finish before they are stopped.
FAILED_RANK_GRACE_SECONDS = 2.0


def run_same_code(
    check: Check,
    project: Project,
    world_size: int,
    module_path: str,
    configuration: str,
    seeds: tuple[int, ...] = SEEDS,
    compared: list[int] | None = None,
) -> NumericComparison:
    """Reference (the builder at world size 1) against every rank at `world_size`, on real numbers."""
    start = time.perf_counter()

    def attempt(dtype: torch.dtype) -> list[NumericComparison]:
        with tempfile.TemporaryDirectory(prefix="shardproof-witness-") as scratch:
            job = {
                "pyproject": str(project.pyproject),
                "check": check.name,
                "configuration": configuration,
                "world_size": world_size,
                "module_path": module_path,
                "seeds": list(seeds),
                "compared": list(compared or []),
                "dtype": str(dtype).removeprefix("torch."),
                # read when called, so that a test can lower them
                "max_parameter_elements": numeric.MAX_PARAMETER_ELEMENTS,
                "timeout": numeric.RUN_TIMEOUT_SECONDS,
            }
            job_file = Path(scratch) / "job.json"
            job_file.write_text(json.dumps(job))
            _run_host(job_file, job["timeout"])
            result = torch.load(Path(scratch) / "result.pt", weights_only=False)
        if "error" in result:
            error = result["error"]
            if result.get("timed_out"):
                raise RunTimedOut(error)
            if result.get("inputs"):
                return [NumericComparison(world_size, configuration, inputs=result["inputs"], failure=error)]
            raise NumericRunError(error)
        comparisons = []
        for seed, description, reference_outputs, rank_outputs, captured in result["trials"]:
            comparison = compare_runs(
                reference_outputs,
                rank_outputs,
                captured,
                world_size,
                check.outputs,
                module_path,
                configuration,
                tolerance_of(dtype),
            )
            comparison.seed, comparison.inputs = seed, description
            comparisons.append(comparison)
            if comparison.differs:
                break
        return comparisons

    best = in_dtypes(attempt, world_size, configuration)
    best.seconds = time.perf_counter() - start
    return best


def _run_host(job_file: Path, timeout: float) -> None:
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    host = subprocess.Popen(
        [sys.executable, "-m", "shardproof.witness.rank_processes", str(job_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # a timeout kills the host and its rank children together
    )
    try:
        _out, err = host.communicate(timeout=timeout + HOST_STARTUP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(host.pid, signal.SIGKILL)
        host.communicate()
        raise NumericRunError(
            f"the rank processes did not finish within {timeout + HOST_STARTUP_SECONDS:.0f} s"
        ) from None
    if not (job_file.parent / "result.pt").exists():
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {host.returncode}"]
        raise NumericRunError(f"the process running the ranks failed: {last[0]}")


# ---------------------------------------------------------------- host and rank processes


def _host(job_file: Path) -> None:
    scratch = job_file.parent
    job = json.loads(job_file.read_text())
    try:
        result = _fork_ranks(job, scratch)
    except RunTimedOut as exc:
        result = {"error": str(exc), "timed_out": True}
    except RankFailure as exc:
        result = {"error": str(exc), "inputs": exc.inputs}
    except NumericRunError as exc:
        result = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - configuration or import errors become the reason
        result = {"error": getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"}
    torch.save(result, scratch / "result.pt")


def _fork_ranks(job: dict[str, Any], scratch: Path) -> dict[str, Any]:
    from ..capture.project_code import import_roots, load_callable

    project = load_project(Path(job["pyproject"]))
    check = project.check(job["check"]).for_mode(job["configuration"])
    world_size: int = job["world_size"]
    with import_roots(project.python_path), _quiet():
        build = load_callable(check.parallel, "parallel", check, project)
        make_inputs = load_callable(check.inputs, "inputs", check, project)
        children: dict[int, int] = {}
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:  # the rank's process: never returns into the host's code
                status = 1
                try:
                    _rank_main(rank, world_size, build, make_inputs, check.relation_override, job, scratch)
                    status = 0
                finally:
                    os._exit(status)
            children[pid] = rank
    _wait(children, scratch, job["timeout"])
    per_rank = [torch.load(scratch / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]
    trials = []
    for index, (seed, description, reference_outputs, reference_module, _, _) in enumerate(per_rank[0]["trials"]):
        captured = {"reference": reference_module} if reference_module is not None else {}
        rank_outputs = []
        for rank, data in enumerate(per_rank):
            *_, outputs, at_module = data["trials"][index]
            rank_outputs.append(outputs)
            if at_module is not None:
                captured[f"rank{rank}"] = at_module
        trials.append((seed, description, reference_outputs, rank_outputs, captured))
    return {"trials": trials}


def _wait(children: dict[int, int], scratch: Path, timeout: float) -> None:
    """Wait for every rank; past the deadline the rest are killed (a collective one rank never
    calls waits forever). Raises for the first rank that failed (RankFailure, with the inputs its
    forward pass failed on when the reference runs them) or for ranks that never finished."""
    deadline = time.monotonic() + timeout
    pending = dict(children)
    still_running: set[int] = set()
    while pending:
        for pid in list(pending):
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                del pending[pid]
        if pending and any((scratch / f"rank{rank}.error").exists() for rank in children.values()):
            # a rank failed: the others wait for it in a collective, so stop them soon
            deadline = min(deadline, time.monotonic() + FAILED_RANK_GRACE_SECONDS)
        if pending and time.monotonic() > deadline:
            still_running = {pending[pid] for pid in pending}
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in pending:
                os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    failures: list[tuple[float, str, str]] = []  # (when, message, inputs)
    for rank in sorted(children.values()):
        error_file = scratch / f"rank{rank}.error"
        if error_file.exists():
            error = json.loads(error_file.read_text())
            failures.append((error["when"], f"rank {rank}: {error['message']}", error.get("inputs", "")))
        elif rank in still_running and not (scratch / f"rank{rank}.pt").exists():
            failures.append((math.inf, f"rank {rank}: still running at the deadline", ""))
        elif not (scratch / f"rank{rank}.pt").exists():
            failures.append((math.inf, f"rank {rank}: ended without a result", ""))
    if still_running and all(when == math.inf for when, _, _ in failures):
        raise RunTimedOut(
            f"the ranks did not finish within {timeout:.0f} s (a collective that not every rank calls waits forever)"
        )
    if failures:
        failures.sort()  # the first to fail is the cause: the others waited for it
        _, message, inputs = failures[0]
        if inputs:
            raise RankFailure(f"{message} (the reference runs these inputs)", inputs)
        raise RankFailure("running the ranks with real numbers failed: " + "; ".join(m for _, m, _ in failures[:2]))


class _FailedOn(Exception):
    """A rank's forward pass raised on one trial's inputs."""

    def __init__(self, inputs: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}{_where(error)}")
        self.inputs = inputs
        self.error = error


def _where(error: BaseException) -> str:
    where = traceback.extract_tb(error.__traceback__)[-1:]
    return f" ({Path(where[0].filename).name}:{where[0].lineno})" if where else ""


def _rank_main(
    rank: int,
    world_size: int,
    build: Any,
    make_inputs: Any,
    relation_override: RelationOverride,
    job: dict[str, Any],
    scratch: Path,
) -> None:
    dtype = getattr(torch, job["dtype"])
    try:
        with default_dtype(dtype), torch.no_grad(), warnings.catch_warnings(), _quiet():
            warnings.simplefilter("ignore")
            _run_rank(rank, world_size, build, make_inputs, relation_override, job, scratch)
    except BaseException as exc:  # noqa: BLE001 - reported as the reason no witness exists
        error: dict[str, Any] = {"when": time.time()}
        if isinstance(exc, _FailedOn):
            error["message"] = str(exc)
            error["inputs"] = "" if harness_failure(exc.error) else exc.inputs
        elif isinstance(exc, NumericRunError):
            error["message"] = str(exc)
        else:
            error["message"] = f"{type(exc).__name__}: {exc}{_where(exc)}"
        (scratch / f"rank{rank}.error").write_text(json.dumps(error))


def _run_rank(
    rank: int,
    world_size: int,
    build: Any,
    make_inputs: Any,
    relation_override: RelationOverride,
    job: dict[str, Any],
    scratch: Path,
) -> None:
    from ..capture.libraries import initialise_libraries, library_shims, reset_libraries

    seeds: list[int] = job["seeds"]
    module_path: str = job["module_path"]
    dtype = getattr(torch, job["dtype"])

    # The reference: the same code as the only rank of a one-rank group.
    with _group(scratch / f"reference{rank}.store", 0, 1), library_shims("cpu"):
        initialise_libraries(1)
        refuse_large(build, job["max_parameter_elements"])
        torch.manual_seed(seeds[0])
        reference = _built(build, "building the model at world size 1")
        reference.to(dtype).eval()
        inputs = make_inputs()
        inputs = to_dtype(inputs if isinstance(inputs, tuple) else (inputs,), dtype)
        reference_runs = []
        weights = {}
        for seed in seeds:
            randomize(reference, seed)
            weights[seed] = [p.detach().clone() for p in reference.parameters()]
            trials = input_trials(reference, inputs, world_size, seed, job["compared"])
            for description, candidate, outputs, captured in run_reference(reference, trials, module_path):
                reference_runs.append((seed, description, candidate, outputs, captured.get("reference")))
        reset_libraries()

    with _group(scratch / "ranks.store", rank, world_size), library_shims("cpu"):
        initialise_libraries(world_size)
        torch.manual_seed(seeds[0])
        module = _built(build, f"building rank {rank}")
        module.to(dtype).eval()
        trials = []
        loaded = None
        for seed, description, candidate, reference_outputs, reference_module in reference_runs:
            if seed != loaded:
                for parameter, value in zip(reference.parameters(), weights[seed], strict=True):
                    parameter.data.copy_(value)
                load_reference_values(module, reference, relation_override, rank, world_size)
                loaded = seed
            captured = {}
            hook = hook_module(module, module_path, captured, "rank")
            try:
                outputs, _ = tree_flatten(module(*candidate))
            except Exception as exc:  # a rank that fails where the reference runs
                raise _FailedOn(description, exc) from exc
            finally:
                if hook is not None:
                    hook.remove()
            trials.append((seed, description, reference_outputs, reference_module, outputs, captured.get("rank")))
        # before the group is torn down: a rank that finished must not be blamed for one that waits
        torch.save({"trials": trials}, scratch / f"rank{rank}.pt")
        reset_libraries()


@contextlib.contextmanager
def _group(store: Path, rank: int, world_size: int) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _quiet() -> Any:
    """User code and the libraries print (fairscale announces its groups); the host's output is
    not read, but a full pipe would block a rank."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _built(build: Any, stage: str) -> nn.Module:
    module = build()
    if not isinstance(module, nn.Module):
        raise NumericRunError(f"{stage}: the builder returned {type(module).__name__}, not an nn.Module")
    return module


def load_reference_values(
    module: nn.Module, reference: nn.Module, relation_override: RelationOverride, rank: int, world_size: int
) -> None:
    """Every rank tensor gets its value from the reference tensor of the same name, under the
    relation the static proof assumes for the same code (see `capture.same_code.same_code_relation`):
    a declaration first, else the same shape is the same tensor and a shape `world_size` times
    smaller along one dim is the rank's contiguous block. Anything else keeps what the builder made."""

    def same_code_value(source: torch.Tensor | None, tensor: torch.Tensor) -> torch.Tensor | None:
        if source is None:
            return None
        if source.shape == tensor.shape:
            return source
        dim = same_code_sharded_dim(tuple(tensor.shape), tuple(source.shape), world_size)
        if dim is None:
            return None
        start, end = declared_shard(source.shape[dim], rank, world_size)
        return source.narrow(dim, start, end - start)

    load_declared_values(module, reference, relation_override, rank, world_size, undeclared=same_code_value)


if __name__ == "__main__":
    _host(Path(sys.argv[1]))
