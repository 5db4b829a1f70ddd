"""Import the user's modules from the editor's unsaved buffers instead of the files on disk.

While a job runs, modules whose source file has an overlay are loaded from the overlay text
(compiled with the real file name, so every frame and every captured site points at the file the
user is editing), and `linecache` serves the same text, so the code shown next to a site is what
is on screen.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import linecache
import os
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any


def _real(path: str) -> str:
    return os.path.realpath(path)


class _OverlayLoader(importlib.abc.SourceLoader):
    def __init__(self, fullname: str, path: str, text: str) -> None:
        self.fullname = fullname
        self.path = path
        self.text = text

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_data(self, path: str) -> bytes:
        if _real(path) == _real(self.path):
            return self.text.encode("utf-8")
        with open(path, "rb") as handle:
            return handle.read()


class _OverlayFinder(importlib.abc.MetaPathFinder):
    def __init__(self, overlay: dict[str, str]) -> None:
        self.overlay = overlay

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        text = self.overlay.get(_real(spec.origin))
        if text is None:
            return None
        spec.loader = _OverlayLoader(fullname, spec.origin, text)
        return spec


_OVERLAID_LINES: set[str] = set()


@contextlib.contextmanager
def source_overlay(overlay: dict[str, str]) -> Iterator[None]:
    """Serve `overlay` (real path -> text) to imports and to linecache while active."""
    real = {_real(path): text for path, text in overlay.items()}
    for name in list(_OVERLAID_LINES):
        linecache.cache.pop(name, None)
    _OVERLAID_LINES.clear()
    linecache.checkcache()
    for path, text in overlay.items():
        lines = text.splitlines(keepends=True)
        for name in {path, _real(path)}:
            linecache.cache[name] = (len(text), None, lines, name)
            _OVERLAID_LINES.add(name)
    finder = _OverlayFinder(real)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def read_source(path: str, overlay: dict[str, str]) -> str | None:
    """A file's text as the user sees it: the overlay when present, else the disk."""
    text = overlay.get(path) or overlay.get(_real(path))
    if text is not None:
        return text
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None
