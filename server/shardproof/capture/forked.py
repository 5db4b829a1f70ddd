"""Capture the ranks of a world size in forked processes, one per core.

Capturing a rank (building it on meta tensors, tracing it, normalising the graph) is independent
of the other ranks and takes most of a run. The process forks after the project is imported and
the reference captured; each child captures every `workers`-th rank and sends its results back
pickled, and this process captures its own share meanwhile. A rank a child could not deliver (its
capture raised, the child died, a result that does not pickle) is captured again here, in rank
order, so errors are raised exactly as by a capture of one rank after another.

Children run torch with one intra-op thread: an OpenMP thread team of the parent (left by a
numeric witness) does not survive a fork, and meta tensors need no threads.
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


def map_ranks(
    capture_one: Callable[[int], T],
    world_size: int,
    workers: int | None = None,
    check_first: Callable[[T], None] | None = None,
    announce: Callable[[int], None] | None = None,
) -> list[T]:
    """[capture_one(rank) for rank in range(world_size)], the ranks shared among `workers`
    processes (default: one per core). `capture_one` must not change state this process relies on
    later (children's changes are lost); what it returns must pickle. `check_first` sees rank 0's
    result as soon as it is captured: what it raises stops every process and is raised at once (a
    capture that rank 0 already shows to be of no use is not finished for the other ranks), as is
    an error of rank 0 itself. `announce(rank)` is called before each rank this process captures
    (progress reports: a child must not write to this process's channels)."""
    workers = min(workers or default_workers(), world_size)
    check = check_first or (lambda _result: None)
    say = announce or (lambda _rank: None)

    def here(rank: int) -> T:
        say(rank)
        return capture_one(rank)

    if workers <= 1 or not hasattr(os, "fork"):
        first = here(0)
        check(first)
        return [first] + [here(rank) for rank in range(1, world_size)]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # else the children would write this process's buffered output again
    children: list[tuple[int, int, list[int]]] = []  # (pid, read end, ranks)
    collected: set[int] = set()
    try:
        for share in range(1, workers):
            ranks = list(range(share, world_size, workers))
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(read_end)
                _serve_child(capture_one, ranks, write_end)
            os.close(write_end)
            children.append((pid, read_end, ranks))
        results: dict[int, object] = {}
        own_error: tuple[int, BaseException] | None = None
        for rank in range(0, world_size, workers):
            if rank == 0:  # no other rank comes before it: its error or check ends the capture now
                results[0] = here(0)
                check(results[0])  # type: ignore[arg-type]
                continue
            try:
                results[rank] = here(rank)
            except Exception as exc:  # noqa: BLE001 - raised below, in rank order
                own_error = (rank, exc)
                break
        for pid, read_end, ranks in children:
            collected.add(pid)
            results.update(_collect(pid, read_end, ranks))
    finally:
        for pid, read_end, _ in children:
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


def _serve_child(capture_one: Callable[[int], object], ranks: list[int], write_end: int) -> None:
    code = 0
    try:
        from ..worker import stacks

        stacks.register()  # the server may ask where this child is (a builder that never returns)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        delivered: dict[int, object] = {}
        for rank in ranks:
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
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return
        code = 1
    finally:
        os._exit(code)


def _collect(pid: int, read_end: int, ranks: list[int]) -> dict[int, object]:
    """What a child delivered; nothing when it died or sent something unreadable."""
    chunks: list[bytes] = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            chunks.append(chunk)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    try:
        delivered, names = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - a truncated or empty answer: captured again by the parent
        return {}
    environment.add_names(names)
    return {rank: value for rank, value in delivered.items() if rank in ranks}
