"""Capture the ranks of a world size in forked processes, one per core.

Capturing a rank (building it on meta tensors, tracing it, normalising the graph) is independent
of the other ranks and takes most of a run. The process forks after the project is imported;
every process then takes the next rank not yet taken (a counter the processes share), so a
process that had other work first (this one captures rank 0, and whatever `before_own` does,
while the children already capture) takes fewer ranks. Children send their results back pickled.
A rank a child could not deliver (its capture raised, the child died, a result that does not
pickle) is captured again here, in rank order, so errors are raised exactly as by a capture of
one rank after another.

Children run torch with one intra-op thread: an OpenMP thread team of the parent (left by a
numeric witness) does not survive a fork, and meta tensors need no threads.

With `isolate`, every rank is captured in a fork of its own, made from the state its process had
when the ranks began: what the processes prepared before (a reference built once for every rank)
is the same, untouched, for each rank, whatever an earlier rank's capture changed. Inside such a
fork `in_own_fork()` is true; a rank captured again here (its fork failed) is not in one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Callable
from typing import TypeVar

from ..cores import default_workers
from . import environment

T = TypeVar("T")

_FAILED = object()
_IN_OWN_FORK = False


def in_own_fork() -> bool:
    """Whether this process is the fork of one rank's capture (see `isolate`)."""
    return _IN_OWN_FORK


def map_ranks(
    capture_one: Callable[[int], T],
    world_size: int,
    workers: int | None = None,
    check_first: Callable[[T], None] | None = None,
    announce: Callable[[int], None] | None = None,
    before_own: Callable[[], None] | None = None,
    isolate: bool = False,
    learn: Callable[[T], None] | None = None,
    known: dict[int, T] | None = None,
) -> list[T]:
    """[capture_one(rank) for rank in range(world_size)], the ranks shared among `workers`
    processes (default: one per core). `capture_one` must not change state this process relies on
    later (children's changes are lost); what it returns must pickle. `before_own` runs here once
    the children are started, before rank 0 (work this process needs, done while the children
    capture). `check_first` sees rank 0's result as soon as it is captured: what it raises stops
    every process and is raised at once (a capture that rank 0 already shows to be of no use is
    not finished for the other ranks), as is an error of rank 0 itself or of `before_own`.
    `announce(rank)` is called before each rank this process captures (progress reports: a child
    must not write to this process's channels). `isolate`: each rank in a fork of its own (see the
    module docstring); `learn(result)` then runs in the process that asked for each result its
    fork delivered (what a later rank's fork should start from: graphs it may reuse). `known`:
    results already at hand (stored captures), returned as they are without capturing their ranks."""
    known = known or {}
    workers = min(workers or default_workers(), world_size - len(known))
    check = check_first or (lambda _result: None)
    say = announce or (lambda _rank: None)
    prepare = before_own or (lambda: None)

    def captured(rank: int) -> T:
        if rank in known:
            return known[rank]
        if isolate:
            result = _in_fork(capture_one, rank)
            if result is not _FAILED:
                if learn is not None:
                    learn(result)  # type: ignore[arg-type]
                return result  # type: ignore[return-value]
        return capture_one(rank)  # not in a fork of its own: `in_own_fork()` is false

    def here(rank: int) -> T:
        if rank not in known:
            say(rank)
        return captured(rank)

    if workers <= 1 or not hasattr(os, "fork"):
        prepare()
        first = here(0)
        check(first)
        return [first] + [here(rank) for rank in range(1, world_size)]
    _flush_streams()  # else the children would write this process's buffered output again
    queue = _RankQueue(world_size, set(known))
    children: list[tuple[int, int]] = []  # (pid, read end)
    collected: set[int] = set()
    try:
        for _ in range(1, workers):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(read_end)
                _serve_child(captured, queue, write_end)
            os.close(write_end)
            children.append((pid, read_end))
        results: dict[int, object] = {}
        own_error: tuple[int, BaseException] | None = None
        prepare()
        results[0] = here(0)  # no other rank comes before it: its error or check ends the capture now
        check(results[0])  # type: ignore[arg-type]
        while (rank := queue.take()) is not None:
            try:
                results[rank] = here(rank)
            except Exception as exc:  # noqa: BLE001 - raised below, in rank order
                own_error = (rank, exc)
                break
        for pid, read_end in children:
            collected.add(pid)
            results.update(_collect(pid, read_end, world_size))
    finally:
        for pid, read_end in children:
            if pid in collected:
                continue
            with contextlib.suppress(OSError):
                os.close(read_end)
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, 9)
                os.waitpid(pid, 0)
    ordered: list[T] = []
    for rank in range(world_size):
        if own_error is not None and rank == own_error[0]:
            raise own_error[1]
        value = results.get(rank, _FAILED)
        ordered.append(here(rank) if value is _FAILED else value)  # type: ignore[arg-type]
    return ordered


class _RankQueue:
    """The ranks after 0 not yet taken by any process (a counter in memory the forks share), but
    those skipped."""

    def __init__(self, world_size: int, skipped: set[int]) -> None:
        import multiprocessing

        self._next = multiprocessing.RawValue("i", 1)
        self._lock = multiprocessing.Lock()
        self._world_size = world_size
        self._skipped = skipped  # ranks whose results are known: never taken

    def take(self) -> int | None:
        with self._lock:
            rank = self._next.value
            while rank in self._skipped:
                rank += 1
            if rank >= self._world_size:
                return None
            self._next.value = rank + 1
        return rank


def _in_fork(capture_one: Callable[[int], T], rank: int) -> T | object:
    """capture_one(rank) in a fork of this process; its error is raised here when it pickles.
    _FAILED when the fork could not deliver (it died, its result does not pickle)."""
    global _IN_OWN_FORK
    _flush_streams()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank's fork: never returns
        os.close(read_end)
        code = 0
        try:
            _prepare_fork()
            _IN_OWN_FORK = True
            try:
                outcome: tuple[str, object] = ("result", capture_one(rank))
            except Exception as exc:  # noqa: BLE001 - raised again in the process that asked
                outcome = ("error", exc)
            try:
                payload = pickle.dumps((outcome, environment.names_read()), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - the process that asked captures the rank itself
                payload = b""
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(payload)
            _flush_streams()
        except BaseException:  # noqa: BLE001 - whatever happens, the fork must not return
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    delivered = False
    try:
        answer = _read_to_end(pid, read_end)
        delivered = True
    finally:
        if not delivered:  # interrupted here: the fork must not outlive the question
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, 9)
                os.waitpid(pid, 0)
    try:
        (kind, value), names = pickle.loads(answer)
    except Exception:  # noqa: BLE001 - an empty or truncated answer
        return _FAILED
    environment.add_names(names)
    if kind == "error":
        raise value  # type: ignore[misc]
    return value


def _serve_child(capture_one: Callable[[int], object], queue: _RankQueue, write_end: int) -> None:
    code = 0
    try:
        _prepare_fork()
        delivered: dict[int, object] = {}
        while (rank := queue.take()) is not None:
            try:
                delivered[rank] = capture_one(rank)
            except BaseException:  # noqa: BLE001 - the parent captures this rank again and raises
                break
        # the environment variables the child's capture read count as read by this capture
        names = environment.names_read()
        try:
            payload = pickle.dumps((delivered, names), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - the parent captures these ranks itself
            payload = pickle.dumps(({}, names), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        _flush_streams()
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return
        code = 1
    finally:
        os._exit(code)


def _collect(pid: int, read_end: int, world_size: int) -> dict[int, object]:
    """What a child delivered; nothing when it died or sent something unreadable."""
    try:
        delivered, names = pickle.loads(_read_to_end(pid, read_end))
    except Exception:  # noqa: BLE001 - a truncated or empty answer: captured again by the parent
        return {}
    environment.add_names(names)
    return {rank: value for rank, value in delivered.items() if 0 < rank < world_size}


def _read_to_end(pid: int, read_end: int) -> bytes:
    """Everything a forked process wrote to its pipe, once it has ended."""
    chunks: list[bytes] = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            chunks.append(chunk)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return b"".join(chunks)


def _prepare_fork() -> None:
    """What a forked capture process does first: register where it is (the server may ask, a
    builder that never returns), and run torch with one thread (the parent's OpenMP team does not
    survive the fork, and meta tensors need no threads)."""
    from ..worker import stacks

    stacks.register()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _flush_streams() -> None:
    """Flush this process's output before a fork or an exit (else it is written twice, or lost)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
