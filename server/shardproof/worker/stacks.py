"""Where a worker process is, asked from outside: the language server can tell the user which line
of their code a long verification is running (an endless loop in a builder), and where it was when
it had to be stopped.

Each process that runs user code (the worker, the children it forks to capture ranks) registers
`faulthandler` for SIGUSR1 with a file of its own in the directory the server names
(`SHARDPROOF_STACKS_DIR`); the server signals the processes that registered and reads the
tracebacks they write. Only the standard library: the server reads these files too.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

DIRECTORY_ENV = "SHARDPROOF_STACKS_DIR"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_open_files: list[object] = []  # kept open for the life of the process (faulthandler writes to them)


def register() -> None:
    """Dump this process's threads to `<directory>/<pid>.txt` on SIGUSR1 (when the server asked)."""
    directory = os.environ.get(DIRECTORY_ENV)
    if not directory or not hasattr(signal, "SIGUSR1"):
        return
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        handle = open(Path(directory) / f"{os.getpid()}.txt", "w")  # noqa: SIM115 - lives with the process
        _open_files.append(handle)
        faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True, chain=False)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str


def sample(directory: str, wait: float = 0.5) -> dict[int, list[Frame]]:
    """Each registered live process's current stack (its signalled thread, innermost first)."""
    pids = []
    for path in Path(directory).glob("*.txt"):
        try:
            pid = int(path.stem)
            os.kill(pid, signal.SIGUSR1)
            pids.append(pid)
        except (ValueError, ProcessLookupError, PermissionError):
            with contextlib.suppress(OSError):
                path.unlink()  # a process that ended
    if not pids:
        return {}
    time.sleep(wait)
    stacks = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            text = (Path(directory) / f"{pid}.txt").read_text(errors="replace")
            stacks[pid] = _last_dump(text)
    return stacks


def _last_dump(text: str) -> list[Frame]:
    """The frames of the signalled thread in the last dump of a file (dumps are appended)."""
    start = text.rfind("Current thread")
    if start < 0:
        return []
    frames = []
    for line in text[start:].splitlines()[1:]:
        if not line.strip():
            break
        match = _FRAME.match(line)
        if match is None:
            if not line.startswith(" "):
                break
            continue
        frames.append(Frame(match["file"], int(match["line"]), match["function"]))
    return frames


def running_in(stacks: dict[int, list[Frame]], root: str) -> Frame | None:
    """The innermost frame in a file of the project at `root` (not an installed package in it) of
    the process deepest in the user's code, or None."""
    root = os.path.realpath(root) + os.sep
    best: tuple[int, Frame] | None = None
    for frames in stacks.values():
        for depth, frame in enumerate(frames):
            path = os.path.realpath(frame.file)
            if path.startswith(root) and f"{os.sep}site-packages{os.sep}" not in path:
                if best is None or depth < best[0]:
                    best = (depth, frame)
                break
    return best[1] if best else None
