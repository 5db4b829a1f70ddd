"""The server's side of the worker: spawn it with this interpreter, send jobs, follow progress,
cancel, and replace it when it crashes, runs out of memory or exceeds its time limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..worker import stacks
from ..worker.protocol import decode, encode

log = logging.getLogger("shardproof.server")

ProgressCallback = Callable[[dict[str, Any]], None]
StateCallback = Callable[[str, str], None]  # (state, detail)

CANCEL_GRACE_SECONDS = 3.0


class WorkerFailure(RuntimeError):
    """The worker died or timed out while running a job; `reason` is for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobCancelled(Exception):
    pass


@dataclass
class _Job:
    id: int
    future: asyncio.Future[dict[str, Any]]
    on_progress: ProgressCallback | None
    cancelled: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    stopping: asyncio.Future[None] | None = None


class WorkerClient:
    def __init__(self, on_state: StateCallback | None = None, env: dict[str, str] | None = None) -> None:
        self.on_state = on_state or (lambda state, detail: None)
        # where the worker's processes write their stacks when asked (worker/stacks.py)
        self.stacks_dir = tempfile.mkdtemp(prefix="shardproof-stacks-")
        self.env = {**(env if env is not None else os.environ), stacks.DIRECTORY_ENV: self.stacks_dir}
        self.process: asyncio.subprocess.Process | None = None
        self.info: dict[str, Any] = {}
        self._job: _Job | None = None
        self._next_id = 0
        self._reader: asyncio.Task[None] | None = None
        self._stderr: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        self._starting: asyncio.Future[None] | None = None
        self._stopping = False

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Make sure a worker runs. Single-flight: a job that starts while a restart is spawning the
        new worker waits for that one instead of spawning a second."""
        if self._starting is not None and not self._starting.done():
            await asyncio.shield(self._starting)
            return
        if self.process is not None and self.process.returncode is None:
            return
        self._starting = asyncio.ensure_future(self._spawn())
        try:
            await asyncio.shield(self._starting)
        finally:
            self._starting = None

    async def _spawn(self) -> None:
        self.on_state("starting", "")
        ready = asyncio.get_running_loop().create_future()
        self._ready = ready
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shardproof.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,
            limit=64 * 1024 * 1024,
        )
        self.process = process
        self._reader = asyncio.create_task(self._read(process, ready))
        self._stderr = asyncio.create_task(self._forward_stderr(process))
        self.info = await asyncio.wait_for(ready, timeout=120)
        log.info(
            "worker %s ready: python %s, %s", self.info.get("pid"), self.info.get("python"), self.info.get("versions")
        )
        self.on_state("ready", f"pid {self.info.get('pid')}")

    async def stop(self) -> None:
        self._stopping = True
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(Exception):
                assert process.stdin is not None
                process.stdin.write(encode({"method": "shutdown"}).encode())
                await process.stdin.drain()
            try:
                await asyncio.wait_for(process.wait(), timeout=5)
            except TimeoutError:
                self._kill(process)
        self.process = None
        self._stopping = False

    def _kill(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    async def restart(self, reason: str) -> None:
        log.warning("restarting the worker: %s", reason)
        self.on_state("restarting", reason)
        if self._starting is not None and not self._starting.done():
            # Let the worker being spawned come up first: killing it mid-start would fail that start
            # for everyone waiting on it, and they would not get the replacement.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting)
        job = self._job
        if job is not None and not job.future.done():
            job.future.set_exception(WorkerFailure(reason))  # it dies with this worker
        process = self.process
        # Forget the process before killing it, so that its reader does not report our own kill as a crash.
        self.process = None
        if process is not None and process.returncode is None:
            self._kill(process)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), timeout=5)
        await self.start()

    async def where(self, root: str) -> stacks.Frame | None:
        """The line of the project at `root` the running job is executing (None when it is not in
        the project's code, or no job runs)."""
        if self._job is None or self.process is None:
            return None
        sampled = await asyncio.to_thread(stacks.sample, self.stacks_dir)
        return stacks.running_in(sampled, root)

    # -- jobs ----------------------------------------------------------------------------------------
    async def run(
        self, method: str, params: dict[str, Any], timeout: float, on_progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """Run one job; raises JobCancelled or WorkerFailure (after restarting the worker)."""
        async with self._lock:
            await self.start()
            assert self.process is not None and self.process.stdin is not None
            self._next_id += 1
            job = _Job(self._next_id, asyncio.get_running_loop().create_future(), on_progress)
            # A job cancelled after its caller stopped waiting still ends with an exception: mark it seen.
            job.future.add_done_callback(lambda future: future.cancelled() or future.exception())
            self._job = job
            self.on_state("busy", params.get("check", ""))
            try:
                self.process.stdin.write(encode({"id": job.id, "method": method, "params": params}).encode())
                await self.process.stdin.drain()
                return await asyncio.wait_for(asyncio.shield(job.future), timeout=timeout or None)
            except TimeoutError:
                await self.restart(f"a verification exceeded the worker timeout ({timeout:g} s)")
                raise WorkerFailure(f"verification took longer than {timeout:g} s and was stopped") from None
            except (BrokenPipeError, ConnectionResetError):
                reason = await self._death_reason()
                await self.restart(reason)
                raise WorkerFailure(reason) from None
            except WorkerFailure as failure:
                if self.process is None or self.process.returncode is not None:
                    await self.restart(failure.reason)
                raise
            except asyncio.CancelledError:
                # Our caller was cancelled (a newer edit): stop the job before giving up the lock,
                # so that the next job neither queues behind it nor dies with it.
                await self._stop(job)
                raise
            finally:
                self._job = None
                if self.process is not None and self.process.returncode is None:
                    self.on_state("idle", f"pid {self.info.get('pid')}")

    async def cancel(self) -> None:
        """Stop the running job: ask the worker, then kill and replace it if it does not stop promptly."""
        job = self._job
        if job is None or job.future.done():
            return
        await self._stop(job)

    async def _stop(self, job: _Job) -> None:
        """Stop `job` once, however many callers ask (the canceller and the cancelled caller)."""
        if job.stopping is None:
            job.stopping = asyncio.ensure_future(self._stop_now(job))
        await asyncio.shield(job.stopping)

    async def _stop_now(self, job: _Job) -> None:
        job.cancelled = True
        process = self.process
        if process is None or process.stdin is None:
            return
        with contextlib.suppress(Exception):
            process.stdin.write(encode({"id": job.id, "method": "cancel"}).encode())
            await process.stdin.drain()
        with contextlib.suppress(TimeoutError, JobCancelled, WorkerFailure):
            await asyncio.wait_for(asyncio.shield(job.future), timeout=CANCEL_GRACE_SECONDS)
        if not job.future.done():
            job.future.set_exception(JobCancelled())
            await self.restart("a cancelled verification did not stop promptly")

    def kill_for_test(self) -> None:
        if self.process is not None:
            self._kill(self.process)

    # -- reading -------------------------------------------------------------------------------------
    async def _read(self, process: asyncio.subprocess.Process, ready: asyncio.Future[dict[str, Any]]) -> None:
        assert process.stdout is not None
        while True:
            try:
                line = await process.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                log.error("a worker message exceeded the size limit")
                continue
            if not line:
                break
            try:
                message = decode(line.decode("utf-8"))
            except ValueError:
                log.error("malformed worker message: %r", line[:200])
                continue
            self._dispatch(message, ready)
        await process.wait()
        if process is self.process and not self._stopping:
            reason = await self._death_reason()
            job = self._job
            if job is not None and not job.future.done():
                job.future.set_exception(WorkerFailure(reason))
            self.on_state("crashed", reason)
        if not ready.done():  # this process died before saying it was ready
            ready.set_exception(WorkerFailure(f"the worker exited during start-up (code {process.returncode})"))

    def _dispatch(self, message: dict[str, Any], ready: asyncio.Future[dict[str, Any]]) -> None:
        event = message.get("event")
        if event == "ready":
            if not ready.done():
                ready.set_result(message)
            return
        job = self._job
        if job is None or message.get("id") != job.id or job.future.done():
            return
        if event == "progress":
            if job.on_progress is not None:
                job.on_progress(message)
        elif event == "result":
            job.future.set_result(message)
        elif event == "cancelled":
            job.future.set_exception(JobCancelled())
        elif event == "failed":
            job.future.set_exception(WorkerFailure(f"the worker failed: {message.get('message')}"))

    async def _forward_stderr(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        while True:
            line = await process.stderr.readline()
            if not line:
                return
            log.info("worker: %s", line.decode("utf-8", "replace").rstrip())

    async def _death_reason(self) -> str:
        process = self.process
        if process is None:
            return "the worker stopped"
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=5)
        code = process.returncode
        if code is None:
            return "the worker stopped responding"
        if code < 0:
            name = signal.Signals(-code).name
            if name == "SIGKILL":
                return "the worker was killed (SIGKILL: out of memory, or stopped by the system)"
            return f"the worker crashed ({name})"
        return f"the worker exited with code {code}"
