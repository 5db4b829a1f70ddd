"""`python -m shardproof.worker`: run verification jobs for the language server.

Jobs arrive on stdin and run one at a time in the main thread; a reader thread takes `cancel`
messages at any time: the running job stops at its next stage boundary, and a running saturation
is stopped by killing its sandbox child. The protocol goes out on a private copy of stdout; the
user's own prints go to stderr with the logs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import sys
import threading
import traceback
from typing import Any, TextIO

from .protocol import decode, encode

log = logging.getLogger("shardproof.worker")


class Cancelled(BaseException):
    """Raised at a stage boundary of a cancelled job (BaseException: user code must not catch it)."""


class Worker:
    def __init__(self, out: TextIO) -> None:
        from ..verify.sandbox import Sandbox

        self.out = out
        self.write_lock = threading.Lock()
        self.jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.cancelled: set[int] = set()
        self.current: int | None = None
        self.sandbox = Sandbox().start()
        # (check, mode) -> (hash of the reference's files, reference capture)
        self.references: dict[tuple[str, str], tuple[str, Any]] = {}
        # the reference cut at its blocks (capture/memoized.py: graphs and values, no module), kept
        # like the whole reference's capture while the reference's files are unchanged
        self.memoized_references: dict[tuple[str, str], tuple[str, Any]] = {}

    def send(self, message: dict[str, Any]) -> None:
        with self.write_lock:
            self.out.write(encode(message))
            self.out.flush()

    def read(self, stream: TextIO) -> None:
        for line in stream:
            if not line.strip():
                continue
            try:
                message = decode(line)
            except ValueError:
                log.error("ignoring a malformed message: %r", line[:200])
                continue
            method = message.get("method")
            if method == "cancel":
                self.cancel(int(message["id"]))
            elif method == "shutdown":
                break
            else:
                self.jobs.put(message)
        self.jobs.put(None)

    def cancel(self, job_id: int) -> None:
        self.cancelled.add(job_id)
        if self.current == job_id:
            self.sandbox.close()  # stops a running saturation; the job stops at its next stage

    def serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                break
            job_id = int(job.get("id", 0))
            if job_id in self.cancelled:
                self.send({"id": job_id, "event": "cancelled"})
                continue
            self.current = job_id
            try:
                if job.get("method") == "verify":
                    self.verify(job_id, job.get("params", {}))
                else:
                    self.send({"id": job_id, "event": "failed", "message": f"unknown method {job.get('method')!r}"})
            except Cancelled:
                self.send({"id": job_id, "event": "cancelled"})
            except Exception as exc:  # noqa: BLE001 - reported to the server, the worker keeps serving
                log.error("job %s failed:\n%s", job_id, traceback.format_exc())
                self.send({"id": job_id, "event": "failed", "message": f"{type(exc).__name__}: {exc}"})
            finally:
                self.current = None
                self.cancelled.discard(job_id)
        self.sandbox.close()

    def verify(self, job_id: int, params: dict[str, Any]) -> None:
        from pathlib import Path

        from ..capture.project_code import import_roots
        from ..config import parse_project
        from ..errors import ShardproofError
        from ..pipeline import verify_check
        from ..results import CheckResult
        from .overlay import read_source, source_overlay

        overlay: dict[str, str] = params.get("overlay") or {}
        pyproject = Path(params["pyproject"])
        mode = params.get("mode", "quick")
        name = params["check"]
        try:
            text = read_source(str(pyproject), overlay)
            if text is None:
                raise ShardproofError(f"cannot read {pyproject}")
            project = parse_project(text, pyproject)
            check = project.check(name).for_mode(mode)
        except ShardproofError as exc:
            result = CheckResult(name, error=exc.to_dict())
            self.send({"id": job_id, "event": "result", "result": result.to_dict()})
            return
        sizes = params.get("world_sizes") or list(check.world_sizes)
        total = 1 + 4 * len(sizes)
        done = [0]

        def progress(check_name: str, world_size: int, stage: str) -> None:
            if job_id in self.cancelled:
                raise Cancelled
            if stage in ("capture", "relations", "verification", "localization"):
                done[0] += 1
            self.send(
                {
                    "id": job_id,
                    "event": "progress",
                    "check": check_name,
                    "world_size": world_size,
                    "stage": stage,
                    "done": min(done[0], total),
                    "total": total,
                }
            )

        key = (name, mode)
        used: list[tuple[Any, str]] = []

        def prepare(capture: Any) -> None:
            capture.read_source = lambda path: read_source(path, overlay)  # stored captures hold for these
            digest = self._files_digest(capture.reference_files, overlay, (check.reference, check.inputs))
            cached = self.references.get(key)
            if cached is not None and cached[0] == digest:
                capture.adopt_reference(cached[1])
            cached_pieces = self.memoized_references.get(key)
            if cached_pieces is not None and cached_pieces[0] == digest:
                capture.memoized_reference = cached_pieces[1]
            used.append((capture, digest))

        with source_overlay(overlay), import_roots(project.python_path):
            result = verify_check(check, project, sizes, self.sandbox, progress, prepare=prepare)
        if job_id in self.cancelled:
            raise Cancelled
        for capture, digest in used:
            if capture.cached_reference() is not None and result.error is None:
                self.references[key] = (digest, capture.cached_reference())
            if capture.memoized_reference is not None and result.error is None:
                self.memoized_references[key] = (digest, capture.memoized_reference)
        self.send({"id": job_id, "event": "result", "result": result.to_dict()})

    @staticmethod
    def _files_digest(files: set[str], overlay: dict[str, str], specs: tuple[str, ...]) -> str:
        from .overlay import read_source

        digest = hashlib.sha256(repr(specs).encode())
        for path in sorted(files):
            digest.update(path.encode())
            digest.update((read_source(path, overlay) or "").encode())
        return digest.hexdigest()


def main() -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("SHARDPROOF_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The protocol keeps stdout for itself; anything the user's code prints goes to stderr.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import warnings

    warnings.filterwarnings("ignore")
    import egglog  # noqa: F401 - import the heavy libraries before saying ready
    import torch

    from ..capture.memoized import warm_up_tracing
    from . import stacks

    warm_up_tracing()  # every run then starts from the same environment (see warm_up_tracing)

    stacks.register()  # the server may ask where a long job is in the user's code
    worker = Worker(protocol_out)
    from importlib.metadata import version

    worker.send(
        {
            "event": "ready",
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "versions": {"torch": torch.__version__, "egglog": version("egglog")},
        }
    )
    reader = threading.Thread(target=worker.read, args=(sys.stdin,), daemon=True)
    reader.start()
    worker.serve()


if __name__ == "__main__":
    main()
