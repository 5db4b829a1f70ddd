"""An on-disk cache of saturations, keyed by what decides their result.

A verification unit (a whole world size, a block template, a skeleton) is a list of egglog
commands; its saturation depends only on those commands, the rule library and the bounds. The
key is a hash of exactly these (with the rule-library and egglog versions), so an entry can never
be used for a unit whose code changed: changed code gives other commands, hence another key.
Only results that do not depend on the machine's speed are kept (a fixpoint, or the iteration
bound); a time, size or memory bound is tried again.

The command line also keeps whole results of a world size, valid while the files and the
environment variables they read are unchanged (see `cached_result`).

The directory is `$SHARDPROOF_CACHE_DIR`, else `$XDG_CACHE_HOME/shardproof`, else
`~/.cache/shardproof`; `SHARDPROOF_CACHE_DIR=off` disables the cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from ..capture.environment import EVERYTHING, relevant, unchanged
from .engine import FACTS_FORMAT, Saturation
from .rules import RULE_LIBRARY_VERSION
from .sandbox import Job

_KEPT = ("fixpoint", "iteration-limit")


class Saturates(Protocol):
    def saturate_all(self, jobs: list[Job]) -> list[Saturation]: ...


def cache_dir() -> Path | None:
    configured = os.environ.get("SHARDPROOF_CACHE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardproof"


def _entry(kind: str, key: str) -> Path | None:
    directory = cache_dir()
    return directory / kind / f"{key}.json" if directory is not None else None


def unit_key(commands: list[str], max_iterations: int, max_rows: int) -> str:
    digest = hashlib.sha256()
    for part in (_rule_library(), FACTS_FORMAT, _egglog_version(), str(max_iterations), str(max_rows)):
        digest.update(part.encode())
        digest.update(b"\0")
    for command in commands:
        digest.update(command.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def saturate(
    sandbox: Saturates, commands: list[str], max_iterations: int, max_seconds: float, max_rows: int
) -> tuple[Saturation, bool]:
    """The saturation of a unit, from the cache when it holds one; (result, whether it was cached)."""
    return saturate_all(sandbox, [Job(commands, max_iterations, max_seconds, max_rows)])[0]


def saturate_all(sandbox: Saturates, jobs: list[Job]) -> list[tuple[Saturation, bool]]:
    """`saturate` for independent units: those the cache lacks are saturated at once."""
    paths = [_entry("units", unit_key(job.commands, job.iterations, job.max_rows)) for job in jobs]
    found: dict[int, Saturation] = {}
    for index, path in enumerate(paths):
        if path is not None and path.is_file():
            # a damaged entry is computed again and replaced
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found[index] = Saturation.from_dict(json.loads(path.read_text()))
    missing = [index for index in range(len(jobs)) if index not in found]
    computed = dict(zip(missing, sandbox.saturate_all([jobs[index] for index in missing]), strict=True))
    for index, result in computed.items():
        path = paths[index]
        if path is not None and result.status in _KEPT and result.facts is not None:
            write_atomically(path, json.dumps(result.to_dict()))
    return [(found[index], True) if index in found else (computed[index], False) for index in range(len(jobs))]


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write atomically, so a concurrent reader never sees half an entry."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = "wb" if isinstance(data, bytes) else "w"
        with tempfile.NamedTemporaryFile(mode, dir=path.parent, delete=False, suffix=".tmp") as handle:
            handle.write(data)
        os.replace(handle.name, path)
    except OSError:
        pass  # a read-only or full cache directory only costs the next run its saturation


@functools.cache
def _rule_library() -> str:
    """The declarations and every rule's text: a saturation is computed by exactly these (a rule
    changed without a new library version must not reuse what the old one saturated)."""
    from . import rules, statements
    from .language import DECLARATIONS

    text = "\n".join(
        (RULE_LIBRARY_VERSION, DECLARATIONS, rules.program_text(), statements.declarations(), rules.schedule(1))
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _egglog_version() -> str:
    return _version("egglog")


# -- whole results of a world size (the command line only) ---------------------------------------
# A check's result at a world size depends on the check's declaration, the files it read (the
# project files it imported and every file a captured operation came from), the environment
# variables its code read (capture/environment.py), the installed libraries and shardproof itself.
# An entry keeps the hashes of those files and the values of those variables; it is used only
# while every one of them is unchanged. The editor's worker does not use it: it verifies unsaved buffers
# that are not the files on disk.
_LIBRARIES = ("torch", "egglog", "transformers", "accelerate", "fairscale", "megatron-core", "llama-models")


def result_key(declaration: str, world_size: int, mode: str) -> str:
    digest = hashlib.sha256()
    versions = [_version("shardproof"), _own_code(), RULE_LIBRARY_VERSION] + [_version(name) for name in _LIBRARIES]
    for part in (declaration, str(world_size), mode, *versions):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def cached_result(key: str, environment: dict[str, str]) -> dict[str, object] | None:
    """The stored result for `key` if every file and environment variable it depended on is
    unchanged (`environment`: the variables now), else None."""
    path = _entry("results", key)
    if path is None or not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if reads_hold(entry, _path_digest, environment):
            return entry["result"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def store_result(
    key: str, result: dict[str, object], files: set[str], names_read: set[str], environment: dict[str, str]
) -> None:
    """Keep `result` with what it depended on: `files`, and the variables `names_read` with their
    values in `environment` (the variables when the run started)."""
    path = _entry("results", key)
    if path is None:
        return
    reads = reads_now(files, _path_digest, names_read, environment)
    if reads is not None:
        write_atomically(path, json.dumps({**reads, "result": result}))


def reads_now(
    files: set[str], digest: Callable[[str], str | None], names_read: set[str], environment: dict[str, str]
) -> dict[str, object] | None:
    """What a stored result (or capture) read, to be checked on every use: each file's `digest`,
    and the variables `names_read` with their values in `environment` (the variables when the run
    started). None when a file cannot be read: it could not be checked next time."""
    digests = {name: digest(name) for name in sorted(files)}
    if any(value is None for value in digests.values()):
        return None
    return {
        "files": digests,
        "environment": relevant(names_read, environment),
        "whole_environment": EVERYTHING in names_read,
    }


def reads_hold(reads: dict[str, Any], digest: Callable[[str], str | None], environment: dict[str, str]) -> bool:
    """Whether every file and variable `reads_now` recorded is unchanged now."""
    files_unchanged = all(digest(name) == value for name, value in reads["files"].items())
    return files_unchanged and unchanged(reads["environment"], reads["whole_environment"], environment)


def _path_digest(name: str) -> str | None:
    return _file_digest(Path(name))


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@functools.cache
def _own_code() -> str:
    """A digest of shardproof's own source: an editable install changes it without a new version,
    and a verdict is computed by that code."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update((_file_digest(path) or "-").encode())
    return digest.hexdigest()


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"
