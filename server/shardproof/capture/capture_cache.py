"""Captured programs kept between runs, each valid while what its capture read is unchanged.

Capturing a rank of a large model (its builder run on meta tensors, its blocks recorded, its
skeleton and templates traced; capture/memoized.py) is most of a run, and the editor verifies the
same check again after every edit. An entry holds one program's pieces with what they were
computed from, in two parts:

- the key: the check's declaration and where its code is imported from, the world size and the
  rank, the example inputs' shapes and dtypes, shardproof's own code and the libraries' versions
  (as for the command line's stored results, verify/cache.py);
- what the capture read, checked on every use: the text of every project file its process had
  imported or a captured operation or parameter came from (as the editor sees it: unsaved
  buffers count), and the environment variables the code read, with their values.

An entry is used only while every one of these is unchanged, so an edit to any file a program's
capture read (the model, the parallel code, a helper module) or to a variable it read captures
that program again. A key keeps its few most recent entries: an edit and its undo both stay.
Entries live beside the saturation cache (`captures/`); `SHARDPROOF_CACHE_DIR=off` disables them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config import Check, Project
from ..verify.cache import cache_dir, reads_hold, reads_now, result_key, write_atomically
from . import environment

ReadSource = Callable[[str], "str | None"]
_KEPT_PER_KEY = 4  # entries of one program kept (the most recently used)


class CaptureCache:
    """The stored captures of one check at one world size (`lookup`, `store` by program name)."""

    def __init__(
        self,
        check: Check,
        project: Project,
        world_size: int,
        inputs: tuple[Any, ...],
        read_source: ReadSource,
        environment_at_start: dict[str, str],
    ) -> None:
        directory = cache_dir()
        self._root = directory / "captures" if directory is not None else None
        where = [str(project.root.resolve()), *(str(path.resolve()) for path in project.python_path)]
        self._declaration = f"{check!r} at {where} inputs {describe_inputs(inputs)}"
        self._world_size = world_size
        self._read = read_source
        self._environment = environment_at_start
        self._digests: dict[str, str | None] = {}  # each file read once per run

    @property
    def enabled(self) -> bool:
        return self._root is not None

    def lookup(self, program: str) -> Any | None:
        """The pieces stored for `program` whose reads all hold now, else None."""
        folder = self._folder(program)
        if folder is None or not folder.is_dir():
            return None
        for reads_path in sorted(folder.glob("*.json"), key=_modified, reverse=True):
            try:
                if not reads_hold(json.loads(reads_path.read_text()), self._digest, self._environment):
                    continue
                pieces = pickle.loads(reads_path.with_suffix(".pickle").read_bytes())
            except Exception:  # noqa: BLE001 - a damaged or unreadable entry is captured again
                continue
            with contextlib.suppress(OSError):
                os.utime(reads_path)  # the most recently used entries are kept
            return pieces
        return None

    def store(self, program: str, pieces: Any, files: set[str]) -> None:
        """Keep `pieces` with the text of `files` now and the variables read so far."""
        folder = self._folder(program)
        if folder is None:
            return
        reads = reads_now(files, self._digest, environment.names_read(), self._environment)
        if reads is None:
            return  # a file that cannot be read cannot be checked next time
        text = json.dumps(reads, sort_keys=True)
        entry = folder / hashlib.sha256(text.encode()).hexdigest()[:32]
        try:
            data = pickle.dumps(pieces, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - what does not pickle is captured again next time
            return
        write_atomically(entry.with_suffix(".pickle"), data)
        write_atomically(entry.with_suffix(".json"), text)  # last: a reader never finds reads alone
        self._forget_old(folder)

    def _folder(self, program: str) -> Path | None:
        if self._root is None:
            return None
        return self._root / result_key(self._declaration, self._world_size, f"capture of {program}")

    def _digest(self, path: str) -> str | None:
        if path not in self._digests:
            text = self._read(path)
            self._digests[path] = hashlib.sha256(text.encode()).hexdigest() if text is not None else None
        return self._digests[path]

    @staticmethod
    def _forget_old(folder: Path) -> None:
        entries = sorted(folder.glob("*.json"), key=_modified, reverse=True)
        for old in entries[_KEPT_PER_KEY:]:
            for path in (old, old.with_suffix(".pickle")):
                with contextlib.suppress(OSError):
                    path.unlink()


def describe_inputs(inputs: Any) -> str:
    """The example inputs as a capture on meta tensors sees them: structure, shapes, dtypes."""
    if isinstance(inputs, torch.Tensor):
        return f"T({list(inputs.shape)},{inputs.dtype})"
    if isinstance(inputs, (list, tuple)):
        return f"{type(inputs).__name__}[{','.join(describe_inputs(item) for item in inputs)}]"
    if isinstance(inputs, dict):
        return "{" + ",".join(f"{key!r}:{describe_inputs(value)}" for key, value in inputs.items()) + "}"
    return repr(inputs)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
