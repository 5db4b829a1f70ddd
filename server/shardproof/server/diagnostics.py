"""Verification results -> LSP diagnostics, per file. Translation only: ranges come from the
source map (LibCST) on the text the user has, columns converted to UTF-16."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types

from ..results import CheckResult, Discrepancy, Site, Unsupported
from ..source_map import refine, utf16_column
from ..witness.describe import headline

SOURCE = "shardproof"
DOCS = "https://github.com/shardproof/shardproof"

TextOf = Callable[[str], str | None]  # path -> the text the user has, or None


def docs_uri(code: str) -> str:
    if code == "unproven":
        return f"{DOCS}#verdicts"
    return (
        f"{DOCS}#discrepancy-kinds-{code}"
        if not code.startswith(("user-", "config", "worker", "incon"))
        else f"{DOCS}#command-line"
    )


# What each mode verifies, in the user's words (diagnostics' data, the status item's tooltip).
CONFIGURATIONS = {"full": "full declaration", "quick": "quick configuration"}


def configured(mode: str) -> str:
    """The prefix a finding's "(check, world sizes)" note gets: a result of the reduced quick
    configuration says so; the full declaration is what the check means, and needs no note."""
    return "quick configuration: " if mode == "quick" else ""


def to_range(site: Site, text: str | None) -> types.Range:
    if text is None:
        line = max(site.line - 1, 0)
        start = (site.column or 1) - 1
        end = (site.end_column - 1) if site.end_column else start + 1
        return types.Range(types.Position(line, start), types.Position(line, end))
    span = refine(site, text)
    lines = text.splitlines()

    def position(line: int, column: int) -> types.Position:
        line_text = lines[line - 1] if 0 < line <= len(lines) else ""
        return types.Position(line - 1, utf16_column(line_text, column))

    return types.Range(position(span.line, span.column), position(span.end_line, span.end_column))


def location(site: Site, text_of: TextOf) -> types.Location:
    return types.Location(uri=Path(site.file).as_uri(), range=to_range(site, text_of(site.file)))


@dataclass
class FileDiagnostic:
    path: str
    diagnostic: types.Diagnostic


def merge_world_sizes(result: CheckResult, unproven: bool = False) -> list[tuple[Discrepancy, list[int]]]:
    """Each finding once, with the world sizes it was found at (discrepancies, or unproven findings)."""
    merged: dict[str, tuple[Discrepancy, list[int]]] = {}
    for world in result.results:
        for d in world.unproven if unproven else world.discrepancies:
            key = f"{d.kind}|{d.primary.file if d.primary else ''}|{d.primary.line if d.primary else 0}"
            if key in merged:
                merged[key][1].append(world.world_size)
            else:
                merged[key] = (d, [world.world_size])
    return list(merged.values())


def related_information(d: Discrepancy, text_of: TextOf) -> list[types.DiagnosticRelatedInformation]:
    """The reference and the related sites, each location once, never the diagnostic's own range
    (a hover that lists the same line twice, or the squiggle itself, says nothing)."""
    own = location(d.primary, text_of) if d.primary is not None else None
    seen: set[tuple[str, int, int]] = set()
    if own is not None:
        seen.add((own.uri, own.range.start.line, own.range.start.character))
    out = []
    sites = [(d.reference, "the reference computes this value here")] if d.reference is not None else []
    sites += [(site, site.note or "related") for site in d.related]
    for site, note in sites:
        where = location(site, text_of)
        key = (where.uri, where.range.start.line, where.range.start.character)
        if key in seen or (own is not None and where.uri == own.uri and where.range.start.line == own.range.start.line):
            continue
        seen.add(key)
        out.append(types.DiagnosticRelatedInformation(where, note))
    return out


def for_check(result: CheckResult, mode: str, text_of: TextOf, pyproject: str, check_line: int) -> list[FileDiagnostic]:
    """Discrepancies as Errors, unproven findings as Warnings (with what the numbers said), then the
    check's inconclusive world sizes and errors."""
    out: list[FileDiagnostic] = []
    for unproven in (False, True):
        for d, sizes in merge_world_sizes(result, unproven):
            if d.primary is None:
                continue
            related = related_information(d, text_of)
            where = "world size" if len(sizes) == 1 else "world sizes"
            data: dict[str, Any] = {
                "discrepancyId": d.id,
                "check": result.name,
                "worldSizes": sizes,
                "mode": mode,
                "configuration": CONFIGURATIONS.get(mode, mode),
                "kind": "unproven" if unproven else d.kind,
            }
            message = f"{d.message} ({result.name}, {configured(mode)}{where} {', '.join(map(str, sizes))})"
            witness = headline(d.witness)
            if witness:
                message += f"\nwitness: {witness}"
            if unproven:
                data["suspected"] = d.kind
                if d.details.get("suspected"):
                    message += f"\nsuspected ({d.kind}, not shown): {d.details['suspected']}"
            code = "unproven" if unproven else d.kind
            out.append(
                FileDiagnostic(
                    d.primary.file,
                    types.Diagnostic(
                        range=to_range(d.primary, text_of(d.primary.file)),
                        message=message,
                        severity=types.DiagnosticSeverity.Warning if unproven else types.DiagnosticSeverity.Error,
                        code=code,
                        code_description=types.CodeDescription(href=docs_uri(code)),
                        source=SOURCE,
                        related_information=related or None,
                        data=data,
                    ),
                )
            )
    for world in result.results:
        for u in world.inconclusive:
            out.append(_inconclusive(result.name, world.world_size, u, text_of, pyproject, check_line))
        if world.error:
            out.append(_error(result.name, world.error, text_of, pyproject, check_line, world.world_size))
    if result.error:
        out.append(_error(result.name, result.error, text_of, pyproject, check_line, None))
    return out


def _at_declaration(pyproject: str, line: int, text_of: TextOf) -> types.Range:
    text = text_of(pyproject) or ""
    lines = text.splitlines()
    line_text = lines[line - 1] if 0 < line <= len(lines) else ""
    return types.Range(
        types.Position(max(line - 1, 0), 0), types.Position(max(line - 1, 0), utf16_column(line_text, len(line_text)))
    )


def _inconclusive(
    check: str, world_size: int, u: Unsupported, text_of: TextOf, pyproject: str, check_line: int
) -> FileDiagnostic:
    return _at_site_or_declaration(
        u.site,
        (pyproject, check_line),
        text_of,
        f"inconclusive ({check}, world size {world_size}): {u.message}",
        types.DiagnosticSeverity.Warning,
        "inconclusive",
        {"check": check, "worldSizes": [world_size], "kind": "inconclusive", "op": u.op},
    )


def _at_site_or_declaration(
    site: Site | None,
    declaration: tuple[str, int],
    text_of: TextOf,
    message: str,
    severity: types.DiagnosticSeverity,
    code: str,
    data: dict[str, Any],
) -> FileDiagnostic:
    """A diagnostic at its site in the user's code, or at the check's declaration when it has none."""
    if site is not None:
        path, range_ = site.file, to_range(site, text_of(site.file))
    else:
        path, range_ = declaration[0], _at_declaration(declaration[0], declaration[1], text_of)
    return FileDiagnostic(
        path,
        types.Diagnostic(
            range=range_,
            message=message,
            severity=severity,
            code=code,
            code_description=types.CodeDescription(href=docs_uri(code)),
            source=SOURCE,
            data=data,
        ),
    )


def _error(
    check: str, error: dict[str, Any], text_of: TextOf, pyproject: str, check_line: int, world_size: int | None
) -> FileDiagnostic:
    site = error.get("site")
    code = "config-error" if error.get("kind") == "ConfigError" else "user-code-error"
    where = f", world size {world_size}" if world_size else ""
    message = f"{error['message']} ({check}{where})"
    as_site = None
    if site is not None:
        as_site = Site(
            site["file"],
            site["line"],
            None if site.get("column") is None else site["column"] + 1,
            site.get("end_line"),
            None if site.get("end_column") is None else site["end_column"] + 1,
        )
    return _at_site_or_declaration(
        as_site,
        (pyproject, check_line),
        text_of,
        message,
        types.DiagnosticSeverity.Error,
        code,
        {"check": check, "kind": code, "error": error["message"], "worldSize": world_size},
    )


def merge_errors(found: list[types.Diagnostic]) -> list[types.Diagnostic]:
    """One diagnostic for an error several checks hit at the same place (an import, syntax or
    builder error in a file they share), naming the checks, instead of identical squiggles."""
    merged: list[types.Diagnostic] = []
    groups: dict[tuple[Any, ...], types.Diagnostic] = {}
    for diagnostic in found:
        data = diagnostic.data if isinstance(diagnostic.data, dict) else {}
        if "error" not in data:
            merged.append(diagnostic)
            continue
        r = diagnostic.range
        key = (r.start.line, r.start.character, r.end.line, r.end.character, diagnostic.code, data["error"])
        first = groups.get(key)
        if first is None:
            groups[key] = diagnostic
            merged.append(diagnostic)
            continue
        checks = first.data.setdefault("checks", [first.data["check"]])
        if data["check"] not in checks:
            checks.append(data["check"])
        if len(checks) > 1:
            first.message = f"{data['error']} (checks {', '.join(checks)})"
    return merged


def worker_problem(
    check: str, reason: str, pyproject: str, check_line: int, text_of: TextOf, site: Site | None = None
) -> FileDiagnostic:
    """The worker could not verify a check: at the line it was running when stopped (an endless
    loop in a builder), else at the check's declaration."""
    message = f"{check}: not verified: {reason}; the worker was restarted and will retry on the next change"
    if site is not None:
        path, range_ = site.file, to_range(site, text_of(site.file))
    else:
        path, range_ = pyproject, _at_declaration(pyproject, check_line, text_of)
    return FileDiagnostic(
        path,
        types.Diagnostic(
            range=range_,
            message=message,
            severity=types.DiagnosticSeverity.Warning,
            code="worker-failed",
            code_description=types.CodeDescription(href=docs_uri("worker-failed")),
            source=SOURCE,
            data={"check": check, "kind": "worker-failed"},
        ),
    )


def still_running(check: str, seconds: float, site: Site, text_of: TextOf) -> FileDiagnostic:
    """A hint at the line a long verification is executing (is it an endless loop?)."""
    return FileDiagnostic(
        site.file,
        types.Diagnostic(
            range=to_range(site, text_of(site.file)),
            message=f"{check}: still running here after {seconds:.0f} s (the verification runs this line of your code)",
            severity=types.DiagnosticSeverity.Information,
            code="still-running",
            source=SOURCE,
            data={"check": check, "kind": "still-running"},
        ),
    )


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
