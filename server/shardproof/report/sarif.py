"""SARIF 2.1.0 output, so CI systems can annotate pull requests with the discrepancies."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import __version__
from ..results import DISCREPANCY_KINDS, CheckResult, Discrepancy, Site

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HELP_URI = "https://github.com/shardproof/shardproof#discrepancy-kinds"
_EXTRA_RULES = {
    "unproven": "neither proven equal nor a shown difference: the first value without a proven relation, "
    "and what the numeric witness found",
    "inconclusive": "the check could not be completed (an unsupported operation or a resource bound)",
    "error": "the declaration or the user's code failed before verification",
}


def _uri(path: str, root: Path | None) -> str:
    if root is not None:
        try:
            relative = os.path.relpath(path, root)
            if not relative.startswith(".."):
                return Path(relative).as_posix()
        except ValueError:
            pass
    return Path(path).as_uri() if os.path.isabs(path) else path


def _location(site: Site, root: Path | None, message: str = "") -> dict[str, Any]:
    region: dict[str, Any] = {"startLine": site.line}
    if site.column:
        region["startColumn"] = site.column
    if site.end_line:
        region["endLine"] = site.end_line
    if site.end_column:
        region["endColumn"] = site.end_column
    location: dict[str, Any] = {
        "physicalLocation": {
            "artifactLocation": {"uri": _uri(site.file, root), "uriBaseId": "%SRCROOT%"},
            "region": region,
        }
    }
    if message:
        location["message"] = {"text": message}
    return location


def _error_site(error: dict[str, Any]) -> Site | None:
    site = error.get("site")
    if not site:
        return None
    column = site.get("column")
    end_column = site.get("end_column")
    return Site(
        site["file"],
        site["line"],
        None if column is None else column + 1,
        site.get("end_line"),
        None if end_column is None else end_column + 1,
        site.get("code", ""),
    )


def _result(rule: str, level: str, text: str, site: Site | None, root: Path | None) -> dict[str, Any]:
    return {
        "ruleId": rule,
        "level": level,
        "message": {"text": text},
        "locations": [_location(site, root)] if site else [],
    }


def _finding(d: Discrepancy, rule: str, level: str, prefix: str, root: Path | None) -> dict[str, Any]:
    """A discrepancy (an error) or an unproven finding (a warning) with its related locations."""
    entry: dict[str, Any] = {
        "ruleId": rule,
        "level": level,
        "message": {"text": f"{prefix}: {d.message}"},
        "locations": [_location(d.primary, root)] if d.primary else [],
        "partialFingerprints": {"shardproofDiscrepancy/v1": d.id},
    }
    related = ([_location(d.reference, root, "reference")] if d.reference else []) + [
        _location(s, root, s.note) for s in d.related
    ]
    for i, location in enumerate(related):
        location["id"] = i
    if related:
        entry["relatedLocations"] = related
    return entry


def render(checks: list[CheckResult], root: Path | None = None) -> dict[str, Any]:
    rules = [
        {"id": kind, "shortDescription": {"text": text}, "helpUri": f"{HELP_URI}-{kind}"}
        for kind, text in {**DISCREPANCY_KINDS, **_EXTRA_RULES}.items()
    ]
    results: list[dict[str, Any]] = []
    for check in checks:
        if check.error:
            message = f"{check.name}: {check.error['message']}"
            results.append(_result("error", "error", message, _error_site(check.error), root))
        for result in check.results:
            prefix = f"{check.name} (world size {result.world_size})"
            for d in result.discrepancies:
                results.append(_finding(d, d.kind, "error", prefix, root))
            for d in result.unproven:
                entry = _finding(d, "unproven", "warning", prefix, root)
                entry["properties"] = {"suspected": d.kind, "witness": (d.witness or {}).get("status", "not-run")}
                results.append(entry)
            for u in result.inconclusive:
                results.append(_result("inconclusive", "warning", f"{prefix}: {u.message}", u.site, root))
            if result.error:
                message = f"{prefix}: {result.error['message']}"
                results.append(_result("error", "error", message, _error_site(result.error), root))
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "shardproof",
                "version": __version__,
                "informationUri": HELP_URI.split("#")[0],
                "rules": rules,
            }
        },
        "results": results,
    }
    if root is not None:
        run["originalUriBaseIds"] = {"%SRCROOT%": {"uri": root.resolve().as_uri() + "/"}}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}
