"""Which environment variables the user's code reads while it is captured.

A model may take its configuration from the environment (`int(os.environ["LAYERS"])`), so a
stored result of a check holds only while those variables are unchanged, like the files it read.
While user code runs (inside `import_roots`) every read of `os.environ` by key is recorded,
whoever reads it (the project, or a library on its behalf), and "everything" when the project's
own code walks the whole mapping (a copy for a subprocess). A library scanning the environment
(networkx looks for its prefixed settings when torch imports it) is not counted: that would make
every result depend on the whole environment (the working directory, the shell level) for
settings that do not change a graph. The names are what is recorded, not the values read: the
check's result depends on the environment the run started with, whatever the capture itself sets
meanwhile (a fake process group's `RANK`).

Forked capture processes record their own reads and send them back (capture/forked.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator

EVERYTHING = "*"  # the whole environment was read
_OWN_PREFIX = "SHARDPROOF_"  # shardproof's own settings: they do not change a verdict

_names: set[str] = set()
_depth = 0
_project_roots: tuple[str, ...] = ()
# frames between a reader and the mapping: os.getenv, Mapping.get/keys/items, os.environ.copy
_PLUMBING = (os.__file__, "<frozen os>", "<frozen _collections_abc>")


class _RecordingEnviron(os._Environ):  # type: ignore[name-defined,misc]
    """`os.environ` while recording: the same object with reads noted (its class is swapped, so
    every module's reference to `os.environ`, `from os import environ` included, records)."""

    def __getitem__(self, key: str) -> str:
        _note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        _note(key)
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        if _depth and _read_by_project():
            _note(EVERYTHING)
        return super().__iter__()


def _read_by_project() -> bool:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in _PLUMBING:
        frame = frame.f_back
    if frame is None:
        return False
    file = frame.f_code.co_filename
    return file.startswith(_project_roots) and "site-packages" not in file


def _note(key: object) -> None:
    if _depth and isinstance(key, str) and not key.startswith(_OWN_PREFIX):
        _names.add(key)


@contextlib.contextmanager
def recording(project_roots: Iterable[str]) -> Iterator[None]:
    """Record the environment variables read inside this block (blocks may nest); the code under
    `project_roots` is the project's."""
    global _depth, _project_roots
    if type(os.environ) is os._Environ:  # type: ignore[attr-defined]
        os.environ.__class__ = _RecordingEnviron
    saved = _project_roots
    _project_roots = tuple(str(root).rstrip("/") + "/" for root in project_roots)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        _project_roots = saved


def names_read() -> set[str]:
    """Every name read while recording, in this process so far (EVERYTHING among them when the
    whole environment was read)."""
    return set(_names)


def add_names(names: Iterable[str]) -> None:
    """Names another process read on this one's behalf (a forked capture)."""
    _names.update(names)


def snapshot() -> dict[str, str]:
    """The environment now, without recording the walk."""
    global _depth
    saved, _depth = _depth, 0
    try:
        return dict(os.environ)
    finally:
        _depth = saved


def relevant(names: set[str], environment: dict[str, str]) -> dict[str, str | None]:
    """What of `environment` a result read: the values of `names` (None: not set), or all of it."""
    if EVERYTHING in names:
        return {k: v for k, v in environment.items() if not k.startswith(_OWN_PREFIX)}
    return {name: environment.get(name) for name in sorted(names)}


def unchanged(recorded: dict[str, str | None], everything: bool, environment: dict[str, str]) -> bool:
    """Whether `environment` has the values a result read (and nothing more, if it read it all)."""
    if everything:
        return relevant({EVERYTHING}, environment) == recorded
    return all(environment.get(name) == value for name, value in recorded.items())
