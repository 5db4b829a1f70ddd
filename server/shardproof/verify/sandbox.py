"""Run saturations in child processes with a memory cap and a wall-clock limit.

egglog aborts the whole process when an allocation fails, and a saturation cannot be
interrupted from Python. Each unit therefore runs in a `python -m shardproof.verify.sandbox`
child (address space capped with RLIMIT_AS, killed on timeout) that reads one JSON job per line
and answers with one JSON line. Children are reused across units and replaced after a crash.

Independent units (the templates and the skeleton of a memoized run, the parts of a partitioned
one) are saturated at once by up to `workers` children, one core each; every child has the
memory cap of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cores import default_workers
from .egglog_adapter import EgglogError, EGraph
from .engine import Saturation, prepared_egraph, saturate


def _limit_memory(megabytes: int) -> Any:
    def apply() -> None:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.setsid()

    return apply


class SandboxCrash(RuntimeError):
    pass


@dataclass(frozen=True)
class Job:
    """One unit to saturate."""

    commands: list[str]
    iterations: int
    seconds: float
    max_rows: int

    @property
    def timeout(self) -> float:
        """The wall-clock limit of the child: the saturation's own bound checks time only between
        iterations, so one long iteration gets some slack before the child is killed."""
        return self.seconds * 1.5 + 60

    def to_json(self) -> str:
        return json.dumps(
            {"commands": self.commands, "iterations": self.iterations, "seconds": self.seconds, "rows": self.max_rows}
        )


class _Child:
    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shardproof.verify.sandbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_limit_memory(memory_mb),
            text=True,
            bufsize=1,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.process.wait(timeout=5)

    def send(self, job: Job) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(job.to_json() + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise SandboxCrash(self.death()) from None

    def answer(self) -> dict[str, Any]:
        """The answer line, once the child's stdout is readable."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SandboxCrash(self.death())
        return json.loads(line)

    def death(self) -> str:
        code = self.process.wait(timeout=5)
        stderr = ""
        if self.process.stderr is not None:
            with contextlib.suppress(Exception):
                stderr = self.process.stderr.read()[-2000:]
        out_of_memory = "memory allocation" in stderr or "MemoryError" in stderr
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            if name == "SIGABRT" or out_of_memory:
                return f"the saturation ran out of its {self.memory_mb} MiB memory limit ({name})"
            return f"the saturation process was killed by {name}"
        if out_of_memory:
            return f"the saturation ran out of its {self.memory_mb} MiB memory limit"
        return f"the saturation process exited with code {code}: {stderr.strip()[-500:]}"


@dataclass
class _Running:
    index: int
    job: Job
    started: float

    @property
    def deadline(self) -> float:
        return self.started + self.job.timeout


class Sandbox:
    """Reusable child processes for saturations, up to `workers` of them at once."""

    def __init__(self, memory_mb: int = 8192, workers: int | None = None) -> None:
        self.memory_mb = memory_mb
        self.workers = max(1, workers or default_workers())
        self._children: list[_Child] = []
        self._generation = 0  # advanced by close(): a batch running then stops starting units

    def start(self) -> Sandbox:
        """Start every child now: each imports egglog (~0.2 s) while this process captures, on
        a core the capture's serial start leaves idle, instead of after it."""
        self._children = [child for child in self._children if child.alive()]
        while len(self._children) < self.workers:
            self._spawn()
        return self

    def saturate(self, commands: list[str], iterations: int, seconds: float, max_rows: int) -> Saturation:
        return self.saturate_all([Job(commands, iterations, seconds, max_rows)])[0]

    def saturate_all(self, jobs: list[Job]) -> list[Saturation]:
        """Saturate independent units at once; the results in the order of `jobs`. A unit whose
        child crashes or runs out of time is a result (memory-limit, crashed, time-limit) and
        does not disturb the others."""
        results: list[Saturation | None] = [None] * len(jobs)
        generation = self._generation
        # the largest units first: a large one started last would run alone while the other
        # children are idle
        pending = sorted(enumerate(jobs), key=lambda item: -len(item[1].commands))
        idle = [child for child in self._children if child.alive()]
        self._children = list(idle)
        running: dict[int, tuple[_Child, _Running]] = {}  # stdout fd -> child and its job
        selector = selectors.DefaultSelector()
        try:
            while pending or running:
                if self._generation != generation:  # closed from another thread (a cancelled job)
                    for child, _ in running.values():
                        self._retire(child)
                    break
                while pending and len(running) < self.workers:
                    index, job = pending.pop(0)
                    child = idle.pop() if idle else self._spawn()
                    try:
                        child.send(job)
                    except SandboxCrash as exc:
                        results[index] = self._crashed(child, exc, 0.0)
                        continue
                    assert child.process.stdout is not None
                    fd = child.process.stdout.fileno()
                    running[fd] = (child, _Running(index, job, time.perf_counter()))
                    selector.register(fd, selectors.EVENT_READ)
                if not running:
                    continue
                now = time.perf_counter()
                wait = min(item.deadline for _, item in running.values()) - now
                ready = {key.fd for key, _ in selector.select(timeout=max(0.0, min(wait, 1.0)))}
                now = time.perf_counter()
                for fd, (child, item) in list(running.items()):
                    outcome: Saturation | None = None
                    if fd in ready:
                        try:
                            outcome = Saturation.from_dict(child.answer())
                            idle.append(child)
                        except SandboxCrash as exc:
                            outcome = self._crashed(child, exc, now - item.started)
                    elif now >= item.deadline:
                        self._retire(child)
                        outcome = Saturation(
                            "time-limit",
                            0,
                            now - item.started,
                            0,
                            f"the saturation did not finish within {item.job.timeout:.0f} s and was stopped",
                        )
                    elif not child.alive():
                        outcome = self._crashed(child, SandboxCrash(child.death()), now - item.started)
                    if outcome is not None:
                        results[item.index] = outcome
                        selector.unregister(fd)
                        del running[fd]
        except BaseException:
            for child, _ in running.values():  # interrupted: no half-answered child is reused
                self._retire(child)
            raise
        finally:
            selector.close()
        stopped = Saturation("crashed", 0, 0.0, 0, "the saturation was stopped")
        return [result if result is not None else stopped for result in results]

    def _spawn(self) -> _Child:
        child = _Child(self.memory_mb)
        self._children.append(child)
        return child

    def _retire(self, child: _Child) -> None:
        child.kill()
        if child in self._children:
            self._children.remove(child)

    def _crashed(self, child: _Child, exc: SandboxCrash, seconds: float) -> Saturation:
        self._retire(child)
        status = "memory-limit" if "memory" in str(exc) else "crashed"
        return Saturation(status, 0, seconds, 0, str(exc))

    def close(self) -> None:
        """Stop every child (also from another thread: a running batch then ends)."""
        self._generation += 1
        for child in list(self._children):
            if child.process.stdin:
                with contextlib.suppress(Exception):
                    child.process.stdin.close()
            child.kill()
        self._children = []

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    # egglog first, before anything else this process allocates: imported after, its e-graphs'
    # memory was not reused from one job to the next (a child's peak grew from 0.49 to 0.71 GB)
    import egglog.bindings  # noqa: F401

    # each job starts from an e-graph with the rules loaded, prepared once while the child waits
    # for its first job (a child is started ahead of it: sandbox.start) and saved before each job:
    # returning to it afterwards (`pop`, ~20 ms) frees the job's facts and is the next job's start,
    # instead of preparing a new e-graph (0.2-0.3 s, after every job, on the way to the next one)
    prepared = _prepared()
    for line in sys.stdin:
        job = json.loads(line)
        saved = prepared is not None and _succeeds(prepared.push)
        result = saturate(job["commands"], job["iterations"], job["seconds"], job["rows"], prepared if saved else None)
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
        sys.stdout.flush()
        if not (saved and prepared is not None and _succeeds(prepared.pop)):
            prepared = None  # the used e-graph is freed first: two alive at once would double the peak
            prepared = _prepared()


def _prepared() -> EGraph | None:
    """A fresh prepared e-graph; None when it cannot be made (the job's own saturation then
    reports why)."""
    try:
        return prepared_egraph()
    except EgglogError:
        return None


def _succeeds(step: Callable[[], None]) -> bool:
    """Whether an e-graph's `push` or `pop` succeeded (else the child prepares a new e-graph)."""
    try:
        step()
    except EgglogError:
        return False
    return True


if __name__ == "__main__":
    main()
