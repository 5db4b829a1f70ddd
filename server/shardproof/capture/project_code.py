"""The user's project code: its import roots on the path while it runs, its modules forgotten
between runs (a long-lived worker verifies edited files), the files it imported, and the
callables a check names."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..config import Check, Project
from ..errors import ConfigError, user_code_error
from ..graph.model import Graph
from ..relations.expr import Expr
from . import environment


@contextlib.contextmanager
def import_roots(paths: tuple[Path, ...]) -> Iterator[None]:
    """Run user code: its import roots on the path, its reads of the environment recorded."""
    added = [str(p) for p in paths if str(p) not in sys.path]
    sys.path[:0] = added
    try:
        with environment.recording(str(p) for p in paths):
            yield
    finally:
        for p in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(p)


_ROOTS_SEEN: set[str] = set()  # the import roots of every project this process verified


def forget_project_modules(project: Project) -> None:
    """Drop already-imported modules of the user's project (by location, and by the packages its
    checks name) so the next import sees the files as they are now: a long-lived worker verifies
    the project again after edits, or another project with the same package names. Modules of a
    project verified before are dropped too: another project's helper module of the same name
    (`from comm import reduce`) must not stand for this one's."""
    _ROOTS_SEEN.update(str(p) + "/" for p in project.python_path)
    roots = tuple(_ROOTS_SEEN)
    specs = [spec for c in project.checks for spec in (c.reference, c.parallel, c.inputs)]
    packages = {spec.split(":")[0].split(".")[0] for spec in specs}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if (file.startswith(roots) and "site-packages" not in file) or name.split(".")[0] in packages:
            del sys.modules[name]
    importlib.invalidate_caches()


def project_files(project: Project) -> set[str]:
    """Source files of the user's project modules imported so far."""
    roots = tuple(str(p) + "/" for p in project.python_path)
    files = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None) or ""
        if file.startswith(roots) and "site-packages" not in file and file.endswith(".py"):
            files.add(file)
    return files


def source_files(graphs: Iterable[Graph], values: Iterable[dict[str, Expr]]) -> set[str]:
    """The files the graphs' operations and the values' expressions came from (not the `<...>`
    names of code without a file)."""
    files: set[str] = set()
    for graph in graphs:
        files.update(graph.source_files)
    for named in values:
        for expr in named.values():
            files.update(expr_files(expr))
    return {file for file in files if not file.startswith("<")}


def expr_files(expr: Expr) -> set[str]:
    from ..relations.expr import children

    files = set()
    if expr.site is not None:
        files.update(f.file for f in expr.site.frames)
    for child in children(expr):
        files.update(expr_files(child))
    return files


def load_callable(spec: str, role: str, check: Check, project: Project) -> Callable[..., Any]:
    module_name, _, attr_path = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(
                f"check {check.name!r}: {role} module {module_name!r} not found (import roots: "
                f"{', '.join(str(p) for p in project.python_path)})",
                project.site(check.line_of(role)),
            ) from None
        raise user_code_error(exc, f"importing {module_name}") from None
    except Exception as exc:  # noqa: BLE001 - any error in user code is reported at its line
        raise user_code_error(exc, f"importing {module_name}") from None
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise ConfigError(
                f"check {check.name!r}: {role} {spec!r}: {module_name} has no {attr_path!r}",
                project.site(check.line_of(role)),
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"check {check.name!r}: {role} {spec!r} is not callable", project.site(check.line_of(role)))
    return target


def read_from_disk(path: str) -> str | None:
    """A project file's text as saved (what a capture read, when no editor overlays it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None
