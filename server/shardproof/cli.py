"""`shardproof verify`: prove each declared check at each world size, or point at the line that breaks it."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from . import __version__
from .config import Project, load_project
from .errors import ShardproofError
from .results import FAIL_ON, CheckResult, exit_code

VERIFY_DESCRIPTION = """\
Verify the checks declared under [tool.shardproof] in pyproject.toml: each parallel program is
captured per rank, related to its sequential reference and proven equal, or the line that breaks
it is reported, backed by real numbers (the numeric witness).

verdicts (per check and world size):
  ✔ verified      proven equal to the reference
  ✘ discrepancy   a difference is shown: real numbers differ, a rank fails where the reference
                  runs, or the ranks' collective calls cannot pair up
  ⚠ unproven      neither proven nor shown: the report names the first value without a proven
                  relation and its line, and what the numbers said on every trial
  ? inconclusive  a saturation bound was hit or an operation is not supported
  ! error         the declaration or your code failed before anything was verified
"""

VERIFY_EPILOG = """\
exit codes:
  0  every check verified (or nothing at or above the --fail-on level)
  1  a discrepancy
  2  inconclusive, or an error (an error always fails the run)
  3  unproven
  The most specific wins: 1 over 2 over 3.

--fail-on LEVEL (for CI):
  discrepancy   fail only on a discrepancy (or an error)
  unproven      fail on a discrepancy or an unproven check (or an error)
  inconclusive  fail on anything not verified (the default)
"""


class Progress:
    """One updating status line on stderr when it is a terminal; silent otherwise."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self._width = 0
        self._start = time.perf_counter()

    def __call__(self, check: str, world_size: int, stage: str) -> None:
        if not self.enabled:
            return
        where = f"world size {world_size}: " if world_size else ""
        text = f"[{check}] {where}{stage}  ({time.perf_counter() - self._start:.0f} s)"
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardproof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"shardproof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser(
        "verify",
        help="verify the checks declared in pyproject.toml",
        description=VERIFY_DESCRIPTION,
        epilog=VERIFY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verify.add_argument(
        "--project",
        type=Path,
        default=Path.cwd(),
        help="project directory or pyproject.toml (default: the current directory)",
    )
    verify.add_argument("--check", action="append", metavar="NAME", help="only this check (repeatable)")
    verify.add_argument(
        "--world-size",
        action="append",
        type=int,
        metavar="N",
        help="only this world size (repeatable; default: the declared ones)",
    )
    verify.add_argument(
        "--quick",
        action="store_true",
        help="verify each check's reduced `quick` configuration (what the editor runs on edits)",
    )
    verify.add_argument(
        "--no-memoize",
        action="store_true",
        help="trace and verify every layer, also when a model repeats a block (for comparison)",
    )
    verify.add_argument(
        "--no-partition",
        action="store_true",
        help="verify each world size whole instead of in parts cut at its blocks (for comparison)",
    )
    verify.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="capture up to N ranks and saturate up to N verification units at once (default: one per core, "
        "or $SHARDPROOF_JOBS)",
    )
    verify.add_argument(
        "--fail-on",
        choices=list(FAIL_ON),
        default="inconclusive",
        metavar="LEVEL",
        help="the least severe verdict that fails the run: discrepancy, unproven or inconclusive (default); "
        "verdicts below it exit 0",
    )
    verify.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the verdicts (auto: when stdout is a terminal and NO_COLOR is not set)",
    )
    verify.add_argument("--json", action="store_true", help="print the results as JSON")
    verify.add_argument("--sarif", type=Path, metavar="FILE", help="also write SARIF 2.1.0 to FILE")
    sub.add_parser("serve", help="run the language server over stdio (for editors)")
    return parser


def _emit_config_error(exc: ShardproofError, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"version": 1, "error": exc.to_dict(), "checks": [], "exit_code": 2}, indent=2))
    else:
        where = ""
        if exc.site is not None:
            where = f"{exc.site.file}:{exc.site.line}: "
        print(f"shardproof: {where}error: {exc.message}", file=sys.stderr)
    return 2


def verify(args: argparse.Namespace) -> int:
    from .pipeline import verify_check
    from .verify.sandbox import Sandbox

    try:
        project: Project = load_project(args.project)
        checks = [project.check(name) for name in args.check] if args.check else list(project.checks)
        checks = [c.for_mode("quick" if args.quick else "full") for c in checks]
    except ShardproofError as exc:
        return _emit_config_error(exc, args.json)
    if args.world_size and any(n < 1 for n in args.world_size):
        print("shardproof: error: --world-size must be positive", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print("shardproof: error: --jobs must be positive", file=sys.stderr)
        return 2
    if args.jobs is not None:
        os.environ["SHARDPROOF_JOBS"] = str(args.jobs)  # read by the capture and the sandbox alike
    progress = Progress(sys.stderr, enabled=sys.stderr.isatty() and not args.json)
    results: list[CheckResult] = []
    memory = max(c.bounds.memory_mb for c in checks)
    try:
        # stdout carries the report (JSON with --json); what the user's code or its libraries print
        # while being built (fairscale announces its groups) goes to stderr.
        with Sandbox(memory).start() as sandbox, contextlib.redirect_stdout(sys.stderr):
            for check in checks:
                progress(check.name, 0, "starting")
                results.append(
                    verify_check(
                        check,
                        project,
                        args.world_size,
                        sandbox,
                        progress,
                        memoize=not args.no_memoize,
                        reuse_results=True,
                        partition=not args.no_partition,
                    )
                )
    except KeyboardInterrupt:
        progress.clear()
        print("shardproof: interrupted", file=sys.stderr)
        return 130
    progress.clear()
    code = exit_code(results, args.fail_on)
    root = project.root
    if args.sarif:
        from .report import sarif

        args.sarif.write_text(json.dumps(sarif.render(results, root), indent=2) + "\n")
    if args.json:
        payload = {
            "version": 1,
            "project": str(project.pyproject),
            "checks": [r.to_dict() for r in results],
            "exit_code": code,
        }
        print(json.dumps(payload, indent=2))
    else:
        from .report import text

        colour = args.color == "always" or (
            args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        )
        sys.stdout.write(text.render(results, root, colour))
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if args.command == "verify":
        return verify(args)
    if args.command == "serve":
        from .server.main import main as serve

        serve()
        return 0
    return 2


def run() -> None:
    """The command's entry point: `main`, then an exit that skips the interpreter's teardown.

    A verification leaves hundreds of thousands of objects (graphs, torch's modules); freeing them
    one by one at exit takes about a second after the report is written. Nothing is lost by
    skipping it: the output streams are flushed and the exit handlers (temporary directories,
    worker processes) run first."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
