"""Errors that reach the user: always with a file and line, never a bare traceback."""

from __future__ import annotations

import traceback
from typing import Any

from .graph.model import Frame


class ShardproofError(Exception):
    """Base class; `site` says where the user should look, and `library_site` where inside an
    installed library the failure was raised when the user's line called into one."""

    def __init__(
        self, message: str, site: Frame | None = None, detail: str = "", library_site: Frame | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.site = site
        self.detail = detail
        self.library_site = library_site

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": type(self).__name__,
            "message": self.message,
            "site": None if self.site is None else _frame_dict(self.site),
            "library_site": None if self.library_site is None else _frame_dict(self.library_site),
            "detail": self.detail,
        }


class ConfigError(ShardproofError):
    """The `[tool.shardproof]` declaration is missing or malformed."""


class UserCodeError(ShardproofError):
    """User code failed: an import error, an exception in a builder, an untraceable model."""


# what to do about split sizes that do not pair up (the misuse most collective calls have)
_PAIR_SPLITS = (
    "make every rank's split sizes pair up: what rank i sends to rank j is what rank j receives from rank i "
    "(the combine of a dispatch swaps them)"
)


class CollectiveCallError(UserCodeError):
    """A collective call that a real process group rejects (split sizes that do not add up): a
    mistake in the parallel program at the call's line, reported as a discrepancy."""

    suggestion: str = _PAIR_SPLITS


class CollectiveMisuse(Exception):
    """Raised while tracing a collective call with arguments no process group accepts."""

    def __init__(self, message: str, suggestion: str = _PAIR_SPLITS) -> None:
        super().__init__(message)
        self.suggestion = suggestion


def _frame_dict(frame: Frame) -> dict[str, Any]:
    return {
        "file": frame.file,
        "line": frame.line,
        "column": frame.column,
        "end_line": frame.end_line,
        "end_column": frame.end_column,
        "function": frame.function,
        "code": frame.code,
        "library": frame.library,
    }


def user_code_error(exc: BaseException, stage: str) -> UserCodeError:
    """Wrap an exception from user code, located at the innermost frame of the user's files."""
    from .capture.frames import is_user_file, library_of

    site: Frame | None = None
    inside: Frame | None = None
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        col = (exc.offset - 1) if exc.offset else None
        end_col = (exc.end_offset - 1) if exc.end_offset and exc.end_offset > 0 else None
        site = Frame(exc.filename, exc.lineno, "<module>", (exc.text or "").strip(), col, exc.end_lineno, end_col)
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
        # An exception raised inside fairscale or megatron is reported at the user's call into it,
        # with the library's own line beside it (where it was raised).
        own = [f for f in frames if library_of(f.filename) is None]
        candidates = own or frames
        if candidates:
            site = _frame_of(candidates[-1])
        if own and frames and frames[-1] is not own[-1]:
            inside = _frame_of(frames[-1])
    detail = "".join(traceback.format_exception(exc)).strip()
    if isinstance(exc, CollectiveMisuse):
        error = CollectiveCallError(_first_line(exc), site, detail, inside)  # the message names the rank
        error.suggestion = exc.suggestion
        return error
    message = f"{stage}: {type(exc).__name__}: {_first_line(exc)}"
    if "DataDependent" in type(exc).__name__:
        # torch's GuardOnDataDependentSymNode / DataDependentOutputException: a size (or a Python
        # value) read from tensor data, which a static capture does not have
        message = (
            f"{stage}: this line needs a value that depends on the data (a data-dependent size: token "
            f"counts as split sizes, nonzero, boolean-mask indexing, .item() / .tolist()); shardproof "
            f"captures with static shapes only: use a fixed capacity ({type(exc).__name__})"
        )
    return UserCodeError(message, site, detail, inside)


def _frame_of(summary: traceback.FrameSummary) -> Frame:
    from .capture.frames import library_of

    return Frame(
        summary.filename,
        summary.lineno or 0,
        summary.name,
        (summary.line or "").strip(),
        getattr(summary, "colno", None),
        getattr(summary, "end_lineno", None),
        getattr(summary, "end_colno", None),
        library_of(summary.filename),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
