"""Run saturations in child processes with a memory cap and a wall-clock limit.

egglog aborts the whole process when an allocation fails, and a saturation cannot be
interrupted from Python. Each unit therefore runs in a `python -m shardproof.verify.sandbox`
child (address space capped with RLIMIT_AS, killed on timeout) that reads one JSON job per line
and answers with one JSON line. Children are reused across units and replaced after a crash.
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
from typing import Any

from .engine import Saturation, saturate


def _limit_memory(megabytes: int) -> Any:
    def apply() -> None:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.setsid()

    return apply


class SandboxCrash(RuntimeError):
    pass


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

    def request(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise SandboxCrash(self._death()) from None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise TimeoutError
                if selector.select(timeout=min(remaining, 1.0)):
                    line = self.process.stdout.readline()
                    if not line:
                        raise SandboxCrash(self._death())
                    return json.loads(line)
                if not self.alive():
                    raise SandboxCrash(self._death())
        finally:
            selector.close()

    def _death(self) -> str:
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


class Sandbox:
    """A reusable child process for saturations."""

    def __init__(self, memory_mb: int = 8192) -> None:
        self.memory_mb = memory_mb
        self._child: _Child | None = None

    def saturate(self, commands: list[str], iterations: int, seconds: float, max_rows: int) -> Saturation:
        if self._child is None or not self._child.alive():
            self._child = _Child(self.memory_mb)
        job = {"commands": commands, "iterations": iterations, "seconds": seconds, "rows": max_rows}
        start = time.perf_counter()
        try:
            return Saturation.from_dict(self._child.request(job, timeout=seconds * 1.5 + 60))
        except TimeoutError:
            self._child = None
            return Saturation(
                "time-limit",
                0,
                time.perf_counter() - start,
                0,
                f"the saturation did not finish within {seconds * 1.5 + 60:.0f} s and was stopped",
            )
        except SandboxCrash as exc:
            self._child = None
            return Saturation(
                "memory-limit" if "memory" in str(exc) else "crashed", 0, time.perf_counter() - start, 0, str(exc)
            )

    def close(self) -> None:
        if self._child is not None:
            if self._child.process.stdin:
                with contextlib.suppress(Exception):
                    self._child.process.stdin.close()
            self._child.kill()
            self._child = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        result = saturate(job["commands"], job["iterations"], job["seconds"], job["rows"])
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
