"""An error raised inside an installed library is reported at the user's line that called into
it, and the text report shows the library's own line too (where it was raised)."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from shardproof.errors import user_code_error
from shardproof.report.text import _error


def _build() -> None:
    Version("not a version")  # raises inside the installed `packaging`


def test_the_library_line_is_kept_beside_the_users_call() -> None:
    try:
        _build()
    except Exception as exc:  # noqa: BLE001 - the error under test
        error = user_code_error(exc, "building the parallel model").to_dict()
    assert error["site"]["file"] == __file__ and error["site"]["function"] == "_build"
    inside = error["library_site"]
    assert inside["library"] == "packaging" and inside["file"].endswith("version.py")
    text = _error(error, Path(__file__).parent, "  ")
    assert any(line.startswith("    raised inside (packaging) at packaging/version.py:") for line in text), text


def test_an_error_in_the_users_own_code_has_no_library_line() -> None:
    try:
        raise ValueError("a mistake of the user's own")
    except ValueError as exc:
        error = user_code_error(exc, "building the parallel model").to_dict()
    assert error["library_site"] is None
    assert not any("raised inside" in line for line in _error(error, None, ""))
