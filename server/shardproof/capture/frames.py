"""Exact user source sites for captured nodes.

torch.fx keeps only frames of functions named `forward` when export records stack traces, so a
collective issued from a helper (`reduce_from_tp`) would be attributed to its caller, and the
recorded frames carry no column information. While a capture runs we replace the frame filter
with one that walks the live Python stack, keeps every frame outside torch and the standard
library, and encodes the exact source range of the executing expression (Python 3.11
`co_positions`) into the frame's function name: `forward [@12:4-12:40]`. `parse_stack_trace`
reads it back.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Iterator
from types import CodeType, FrameType

from ..graph.model import Frame, SourceSite

_MAX_FRAMES = 16
_POSITION = re.compile(r"^(?P<name>.*) \[@(?P<l>\d+):(?P<c>\d+)-(?P<el>\d+):(?P<ec>\d+)\]$")
_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.*)$')


class _BackwardState:
    """Set while autograd runs a backward or shardproof's own joint code runs (capture/gradients.py)."""

    depth = 0


# While autograd runs a backward, only frames inside it describe the operation: the code that
# called `backward()` does not (the forward operation's site is used instead).
BACKWARD = _BackwardState()
_ENGINE_ENTRY = "_engine_run_backward"

_SHARDPROOF_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


# Installed packages that are plumbing around the user's model, never where a bug is.
_INFRASTRUCTURE = (
    "torch",
    "functorch",
    "typing_extensions.py",
    "triton",
    "numpy",
    "egglog",
    "sympy",
    "_pytest",
    "pluggy",
    "pygls",
    "lsprotocol",
    "libcst",
)


@functools.cache
def _skipped_prefixes() -> tuple[str, ...]:
    import torch

    paths = sysconfig.get_paths()
    # the environment's scripts (the `shardproof` console script, pytest's) start the process: never
    # where a model's operation is, even when the model has no frame of its own (a bare nn.Embedding)
    roots = {os.path.dirname(torch.__file__), paths["stdlib"], os.path.dirname(contextlib.__file__), paths["scripts"]}
    for key in ("purelib", "platlib"):
        site_packages = sysconfig.get_paths()[key]
        roots.update(os.path.join(site_packages, name) for name in _INFRASTRUCTURE)
    return tuple(sorted(r.rstrip(os.sep) + (os.sep if not r.endswith(".py") else "") for r in roots))


def is_user_file(filename: str, extra_skips: tuple[str, ...] = ()) -> bool:
    if filename.startswith("<") or filename.startswith(_SHARDPROOF_ROOT):
        return False
    return not filename.startswith(_skipped_prefixes() + extra_skips)


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[key].rstrip(os.sep) + os.sep for key in ("purelib", "platlib")}))


def library_of(filename: str) -> str | None:
    """The installed package a file belongs to (fairscale, megatron, transformers, ...), or None
    for the user's own code. Library frames are kept on every node, but a report points at the
    user's line that called into the library, with the library frame as related information."""
    for root in _installed_roots():
        if filename.startswith(root):
            top = filename[len(root) :].split(os.sep, 1)[0]
            return top.removesuffix(".py") or None
    return None


@functools.lru_cache(maxsize=4096)
def _positions(code: CodeType) -> tuple[tuple[int | None, int | None, int | None, int | None], ...]:
    return tuple(code.co_positions())


def _frame_positions(frame: FrameType) -> tuple[int, int | None, int | None, int | None]:
    lineno = frame.f_lineno
    index = frame.f_lasti // 2
    positions = _positions(frame.f_code)
    if 0 <= index < len(positions):
        start, end, col, end_col = positions[index]
        if start is not None:
            return start, end, col, end_col
    return lineno, None, None, None


def live_user_frames(skip: int = 1, extra_skips: tuple[str, ...] = ()) -> list[traceback.FrameSummary]:
    """User frames of the current stack, outermost first, with positions encoded in the name.

    The walk stops at the first shardproof frame once user frames were seen: that frame is the
    capture call, and everything outside it (our CLI, a test runner) is not the user's model.
    """
    frame: FrameType | None = sys._getframe(skip + 1)
    collected: list[traceback.FrameSummary] = []
    while frame is not None and len(collected) < _MAX_FRAMES:
        filename = frame.f_code.co_filename
        if filename.startswith(_SHARDPROOF_ROOT) and collected:
            break
        if BACKWARD.depth and (frame.f_code.co_name == _ENGINE_ENTRY or filename.startswith(_SHARDPROOF_ROOT)):
            break
        if is_user_file(filename, extra_skips):
            line, end_line, col, end_col = _frame_positions(frame)
            name = frame.f_code.co_name
            if col is not None and end_col is not None and end_line is not None:
                name = f"{name} [@{line}:{col}-{end_line}:{end_col}]"
            collected.append(traceback.FrameSummary(filename, line, name, lookup_line=False))
        frame = frame.f_back
    collected.reverse()
    return collected


def _filter_with_positions(self: object, summary: traceback.StackSummary) -> traceback.StackSummary:
    del self, summary  # the lightweight captured summary has no columns; read the live stack instead
    return traceback.StackSummary.from_list(live_user_frames(skip=1))


@contextlib.contextmanager
def exact_stack_traces() -> Iterator[None]:
    """Record every user frame (with columns) on nodes created while the context is active."""
    import torch.fx.proxy as fx_proxy

    original = fx_proxy.TracerBase._filter_traceback_frames
    captured = fx_proxy.CapturedTraceback
    fx_proxy.TracerBase._filter_traceback_frames = _filter_with_positions  # type: ignore[assignment]
    fx_proxy.CapturedTraceback = _UnreadTraceback  # type: ignore[misc]
    try:
        yield
    finally:
        fx_proxy.TracerBase._filter_traceback_frames = original  # type: ignore[method-assign]
        fx_proxy.CapturedTraceback = captured  # type: ignore[misc]


class _UnreadTraceback:
    """What fx's node creation takes the stack with, when `_filter_with_positions` reads the live
    stack itself: fx would extract and symbolize every frame (dozens of torch's own) for each
    node, only for the filter to ignore them."""

    @staticmethod
    def extract() -> _UnreadTraceback:
        return _UnreadTraceback()

    def summary(self) -> traceback.StackSummary:
        return traceback.StackSummary.from_list([("<unread>", 0, "forward", None)])


def parse_stack_trace(text: str | None) -> SourceSite | None:
    """Parse a `stack_trace` written under `exact_stack_traces` (plain fx traces work too)."""
    if not text:
        return None
    frames: list[Frame] = []
    for raw in text.splitlines():
        match = _FILE_LINE.match(raw)
        if not match:
            continue
        name = match["name"]
        line = int(match["line"])
        column = end_line = end_column = None
        pos = _POSITION.match(name)
        if pos:
            name = pos["name"]
            line, column, end_line, end_column = int(pos["l"]), int(pos["c"]), int(pos["el"]), int(pos["ec"])
        file = match["file"]
        code = linecache.getline(file, line).strip()
        frames.append(Frame(file, line, name, code, column, end_line, end_column, library_of(file)))
    return SourceSite(tuple(frames)) if frames else None


def site_from_live_stack(skip: int = 1) -> SourceSite | None:
    """The user site of the caller (used by the parameter-provenance tracker)."""
    return LiveSites().site(skip=skip + 1)


# traceback's StackSummary.format keeps this many consecutive repetitions of one frame (deep
# recursion); `parse_stack_trace` reads a formatted trace, so the sites built directly keep as many
_RECURSIVE_CUTOFF = 3


class LiveSites:
    """The user site of the live stack, as `parse_stack_trace` reads it from the trace
    `live_user_frames` gives (the same frames, lines, columns and code), built without formatting
    and parsing text and remembered per chain of executing instructions: a builder runs the same
    few lines for every layer, and the provenance tracker asks for the site of every operation.
    One instance per capture (the code text is read once per instruction)."""

    def __init__(self) -> None:
        self._user: dict[str, bool] = {}
        self._frames: dict[tuple[CodeType, int], Frame] = {}
        self._sites: dict[tuple[tuple[CodeType, int], ...], SourceSite | None] = {}

    def site(self, skip: int = 1) -> SourceSite | None:
        """The site of the caller's caller `skip` frames up (skip=1: whoever called the caller)."""
        frame: FrameType | None = sys._getframe(skip + 1)
        chain: list[tuple[CodeType, int]] = []
        user = self._user
        while frame is not None and len(chain) < _MAX_FRAMES:
            code = frame.f_code
            filename = code.co_filename
            if filename.startswith(_SHARDPROOF_ROOT) and chain:
                break
            if BACKWARD.depth and (code.co_name == _ENGINE_ENTRY or filename.startswith(_SHARDPROOF_ROOT)):
                break
            is_user = user.get(filename)
            if is_user is None:
                is_user = user[filename] = is_user_file(filename)
            if is_user:
                instruction = (code, frame.f_lasti)
                if instruction not in self._frames:
                    self._frames[instruction] = _frame_now(frame)
                chain.append(instruction)
            frame = frame.f_back
        key = tuple(chain)
        if key not in self._sites:
            self._sites[key] = self._build(key)
        return self._sites[key]

    def _build(self, chain: tuple[tuple[CodeType, int], ...]) -> SourceSite | None:
        frames: list[Frame] = []
        last: tuple[str, int, str] | None = None
        repeated = 0
        for instruction in reversed(chain):  # outermost first
            frame = self._frames[instruction]
            shown = (frame.file, frame.line, _encoded_name(frame))
            repeated = repeated + 1 if shown == last else 1
            last = shown
            if repeated > _RECURSIVE_CUTOFF or '"' in frame.file:
                continue  # dropped by the formatted trace (or unreadable in it)
            frames.append(frame)
        return SourceSite(tuple(frames)) if frames else None


def _frame_now(frame: FrameType) -> Frame:
    """A live frame as `parse_stack_trace` reads it back from `live_user_frames`' trace."""
    filename = frame.f_code.co_filename
    line, end_line, column, end_column = _frame_positions(frame)
    if column is None or end_column is None or end_line is None:
        column = end_line = end_column = None
    text = linecache.getline(filename, line).strip()
    return Frame(filename, line, frame.f_code.co_name, text, column, end_line, end_column, library_of(filename))


def _encoded_name(frame: Frame) -> str:
    """The frame's name as `live_user_frames` writes it (with the position, when known)."""
    if frame.column is None:
        return frame.function
    return f"{frame.function} [@{frame.line}:{frame.column}-{frame.end_line}:{frame.end_column}]"
