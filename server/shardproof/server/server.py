"""The shardproof language server (pygls 2): squiggles while editing sharding code, "Explain
discrepancy", quick fixes, and "Verify Full Model" with progress.

The event loop never imports user code, torch or egglog: verification runs in the worker
process (worker_client.py). This module keeps the state (declared checks, results, which files
take part in which check), schedules re-verification (debounced on edits, immediately on save,
superseded runs cancelled, stale results dropped) and turns results into diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import linecache
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import FeatureNotificationError, JsonRpcInternalError
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from .. import __version__
from ..config import Project, find_pyproject, parse_project
from ..errors import ConfigError, ShardproofError
from ..localize.explain import explain
from ..localize.picture import picture
from ..results import CheckResult, Discrepancy, Site, WorldSizeResult
from ..source_map import mechanical_fix
from . import diagnostics as diag
from .settings import Settings
from .worker_client import JobCancelled, WorkerClient, WorkerFailure

log = logging.getLogger("shardproof.server")

WORKER_STATE = "shardproof/workerStateChanged"
VERIFICATION_FINISHED = "shardproof/verificationFinished"
VERIFICATION_STARTED = "shardproof/verificationStarted"
PROGRESS = "shardproof/progress"
CMD_VERIFY_FULL_MODEL = "shardproof.server.verifyFullModel"
CMD_EXPLAIN = "shardproof.server.explainDiscrepancy"
CLIENT_CMD_EXPLAIN = "shardproof.explainDiscrepancy"
# After how long a running verification tells the user where in their code it is (and again after as long).
STILL_RUNNING_SECONDS = 10.0


def _real(path: str) -> str:
    return os.path.realpath(path)


@dataclass
class ProjectState:
    """One workspace project: its pyproject.toml with a [tool.shardproof] section."""

    pyproject: Path
    project: Project | None = None
    config_error: ShardproofError | None = None
    results: dict[str, tuple[str, CheckResult]] = field(default_factory=dict)
    dependencies: dict[str, set[str]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # check -> why the worker could not verify it
    failure_sites: dict[str, Site] = field(default_factory=dict)  # check -> the line it ran when stopped
    # check -> the unsaved buffers its stored result was computed from (path -> text)
    overlays: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.pyproject.parent

    def check_names(self) -> list[str]:
        return [c.name for c in self.project.checks] if self.project else []

    def check_line(self, name: str) -> int:
        if self.project is not None:
            for check in self.project.checks:
                if check.name == name:
                    return check.line
        return 1

    def contains(self, path: str) -> bool:
        return _real(path).startswith(_real(str(self.root)) + os.sep) or _real(path) == _real(str(self.pyproject))


class ShardproofLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("shardproof", __version__)
        self.settings = Settings()
        self.projects: list[ProjectState] = []
        self.worker = WorkerClient(on_state=self._worker_state)
        self.generation: dict[tuple[str, str], int] = {}
        self.pending: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self.running: tuple[str, str] | None = None
        self.published: set[str] = set()
        self.background: set[asyncio.Task[Any]] = set()
        self.full_model_running = False
        self.folders: list[str] = []
        # (project, check, the user's line it is executing, seconds) of a long verification
        self.running_at: tuple[ProjectState, str, Site, float] | None = None
        # the running verification's latest progress notification (check, mode, world size, stage)
        self.last_progress: dict[str, Any] = {}

    def report_server_error(self, error: Exception, source: Any) -> None:
        # pygls reports a failure to send (the client went away) by sending a message about it,
        # which fails the same way and is reported again: a busy loop. Say it where it can be seen.
        if source is JsonRpcInternalError:
            logging.getLogger(__name__).error("cannot send to the client: %s", error)
            return
        if source is FeatureNotificationError:
            # A notification has no reply; a popup "Error in server: KeyError: 'file:///…'" is nothing
            # a user can act on. A change to a document the editor never opened is the usual cause.
            if "KeyError: 'file:" in f"{type(error).__name__}: {error}":
                log.warning("ignoring a change to a document that was never opened: %s", error)
            else:
                log.error("a notification handler failed: %r", error, exc_info=error)
            return
        super().report_server_error(error, source)

    # -- helpers ---------------------------------------------------------------------------------------
    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coroutine)
        self.background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self.background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("background task failed", exc_info=t.exception())

        task.add_done_callback(done)
        return task

    def text_of(self, path: str) -> str | None:
        """The text the user has: the open editor buffer, else the file on disk."""
        uri = from_fs_path(path)
        if uri is not None:
            document = self.workspace.text_documents.get(uri)
            if document is not None:
                return document.source
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except OSError:
            return None

    def overlay(self, state: ProjectState) -> dict[str, str]:
        """Unsaved contents of the open documents of a project, for the worker."""
        out = {}
        for uri, document in self.workspace.text_documents.items():
            path = to_fs_path(uri)
            if path and state.contains(path):
                out[path] = document.source
        return out

    def closed(self, path: str) -> None:
        """A document was closed: results computed from its unsaved text no longer describe the
        file (the text on disk); they are withdrawn and the file on disk is verified."""
        real = _real(path)
        for state in self.projects:
            for check, overlay in list(state.overlays.items()):
                if real in overlay and overlay[real] != self.text_of(path):
                    log.info("%s was closed unsaved: verifying %s on the file on disk", path, check)
                    state.results.pop(check, None)
                    state.overlays.pop(check, None)
                    self.schedule(state, check, 0.0)
        self.publish()

    def changed_since(self, overlay: dict[str, str], files: set[str]) -> bool:
        """Whether the text the user has of any of `files` differs from what a run saw: its
        unsaved buffers (`overlay`), else the files on disk."""
        seen = {_real(path): text for path, text in overlay.items()}
        for path in files:
            now = self.text_of(path)
            before = seen.get(path)
            if before is None:
                try:
                    with open(path, encoding="utf-8") as handle:
                        before = handle.read()
                except OSError:
                    before = None
            if now != before:
                return True
        return False

    def versions(self) -> dict[str, int | None]:
        return {uri: doc.version for uri, doc in self.workspace.text_documents.items()}

    def notify_client(self, method: str, params: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            self.protocol.notify(method, params)

    def message(self, kind: types.MessageType, text: str) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=text))

    def _worker_state(self, state: str, detail: str) -> None:
        log.info("worker %s %s", state, detail)
        self.notify_client(WORKER_STATE, {"state": state, "detail": detail})
        if state == "crashed" and self.running is None:
            # A crash during a verification is told with that check's failure; one between
            # verifications (killed for memory while idle) would otherwise go unnoticed.
            self.message(
                types.MessageType.Warning,
                f"shardproof: the worker stopped between verifications: {detail}; "
                "a new one starts with the next verification",
            )

    # -- projects ---------------------------------------------------------------------------------------
    def discover(self, folders: list[str]) -> None:
        seen: set[str] = set()
        for folder in folders:
            pyproject = find_pyproject(Path(folder))
            if pyproject is None or str(pyproject) in seen:
                continue
            text = self.text_of(str(pyproject)) or ""
            if "tool.shardproof" not in text:
                continue
            seen.add(str(pyproject))
            state = ProjectState(pyproject)
            self.load(state)
            self.projects.append(state)
        log.info("projects: %s", [str(p.pyproject) for p in self.projects])

    def load(self, state: ProjectState) -> None:
        text = self.text_of(str(state.pyproject))
        try:
            if text is None:
                raise ConfigError(f"cannot read {state.pyproject}")
            state.project = parse_project(text, state.pyproject)
            state.config_error = None
        except ConfigError as exc:
            state.project = None
            state.config_error = exc
            log.warning("declaration error: %s", exc.message)
        names = set(state.check_names())
        for table in (state.results, state.dependencies, state.failures, state.overlays, state.failure_sites):
            for name in list(table):
                if name not in names:
                    del table[name]

    def project_of(self, path: str) -> ProjectState | None:
        matches = [p for p in self.projects if p.contains(path)]
        return max(matches, key=lambda p: len(str(p.root)), default=None)

    def affected(self, path: str) -> list[tuple[ProjectState, str]]:
        """Checks that take part in `path` (all checks of its project while they are still unknown)."""
        out = []
        real = _real(path)
        for state in self.projects:
            for name in state.check_names():
                deps = state.dependencies.get(name)
                if deps is None:
                    if state.contains(path):
                        out.append((state, name))
                elif real in deps:
                    out.append((state, name))
        return out

    # -- scheduling --------------------------------------------------------------------------------------
    def schedule(self, state: ProjectState, check: str, delay: float) -> None:
        key = (str(state.pyproject), check)
        self.generation[key] = self.generation.get(key, 0) + 1
        generation = self.generation[key]
        previous = self.pending.pop(key, None)
        if previous is not None:
            previous.cancel()
        if self.running == key:
            self.spawn(self.worker.cancel())  # a newer edit supersedes the running verification
        self.pending[key] = self.spawn(self._verify_later(state, check, generation, delay))

    def schedule_all(self, delay: float = 0.0) -> None:
        for state in self.projects:
            for name in state.check_names():
                self.schedule(state, name, delay)

    async def _verify_later(self, state: ProjectState, check: str, generation: int, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        await self.verify(state, check, self.editor_mode(state, check), generation)

    def editor_mode(self, state: ProjectState, check: str) -> str:
        """The configuration the editor verifies of `check` (on opening, edits and saves): "quick"
        when the editorConfiguration setting asks for it and the check declares a quick table, else
        "full" (a check without a quick table has only its full declaration)."""
        if self.settings.editor_configuration != "quick" or state.project is None:
            return "full"
        declared = next((c for c in state.project.checks if c.name == check), None)
        return "quick" if declared is not None and declared.quick is not None else "full"

    def editor_configuration_changed(self) -> None:
        """The editorConfiguration setting changed: verify again the checks whose shown result is
        from the other configuration (those without a quick table are unaffected)."""
        for state in self.projects:
            for name in state.check_names():
                shown = state.results.get(name)
                if shown is None or shown[0] != self.editor_mode(state, name):
                    self.schedule(state, name, 0.0)

    async def verify(
        self,
        state: ProjectState,
        check: str,
        mode: str,
        generation: int | None,
        world_sizes: list[int] | None = None,
        on_progress: Any = None,
    ) -> CheckResult | None:
        key = (str(state.pyproject), check)
        if state.project is None:
            return None
        while self.running is not None and generation is not None:
            await asyncio.sleep(0.05)  # one job at a time; the newest request for a check wins
            if generation != self.generation.get(key):
                return None
        if generation is not None and generation != self.generation.get(key):
            return None
        if state.project is None:  # the declaration broke while this waited: its error is shown
            return None
        overlay = self.overlay(state)
        params = {
            "pyproject": str(state.pyproject),
            "check": check,
            "mode": mode,
            "world_sizes": world_sizes,
            "overlay": overlay,
        }
        self.running = key
        declared = next((c for c in state.project.checks if c.name == check), None)
        sizes = world_sizes or (list(declared.for_mode(mode).world_sizes) if declared is not None else [])
        self.notify_client(VERIFICATION_STARTED, {"check": check, "mode": mode, "worldSizes": sizes})
        self.last_progress = {"check": check, "mode": mode}

        def forward(event: dict[str, Any]) -> None:
            # what the run is doing now, for the status item: the check, the configuration, the
            # world size and stage ("capture", "capturing rank 3 of 8", "verification", ...)
            self.last_progress = {
                "mode": mode,
                **{k: event.get(k) for k in ("check", "world_size", "stage", "done", "total")},
            }
            self.notify_client(PROGRESS, self.last_progress)
            if on_progress is not None:
                on_progress(event)

        watchdog = self.spawn(self._watch(state, check))
        try:
            reply = await self.worker.run("verify", params, self.settings.worker_timeout_seconds, forward)
        except JobCancelled:
            log.info("verification of %s (%s) cancelled", check, mode)
            return None
        except WorkerFailure as failure:
            reason = failure.reason
            running = self.running_at
            if running is not None and running[1] == check:
                site = running[2]
                reason += f", while it was running {os.path.basename(site.file)}:{site.line} in {site.function}"
                state.failure_sites[check] = site
            state.failures[check] = reason
            self.message(types.MessageType.Warning, f"shardproof: {check}: {reason}; the worker was restarted")
            return None
        finally:
            watchdog.cancel()
            self.running = None
            self.running_at = None
            self.publish()
        result = CheckResult.from_dict(reply["result"])
        if generation is not None and generation != self.generation.get(key):
            log.info("dropping a stale result for %s", check)
            return None
        deps = {_real(p) for p in result.dependencies} | {_real(str(state.pyproject))}
        if generation is not None and self.changed_since(overlay, deps):
            # what the user has now is not what was verified: verify that instead (opening a file
            # with the text on disk is no change, so the result stands)
            log.info("dropping a result for %s: a file changed while it ran; verifying again", check)
            if generation == self.generation.get(key):
                self.schedule(state, check, 0.0)
            return None
        if result.error is not None or any(r.error for r in result.results):
            # A run that failed early saw fewer files: keep the ones we knew, and the failing file.
            deps |= state.dependencies.get(check, set())
            for error in [result.error, *[r.error for r in result.results]]:
                if error and error.get("site"):
                    deps.add(_real(error["site"]["file"]))
        state.failures.pop(check, None)
        state.failure_sites.pop(check, None)
        state.results[check] = (mode, result)
        state.overlays[check] = {_real(path): text for path, text in overlay.items()}
        state.dependencies[check] = deps
        self.publish()
        self.notify_client(VERIFICATION_FINISHED, self.summary_of(result, mode))
        return result

    async def _watch(self, state: ProjectState, check: str) -> None:
        """While a verification runs long, tell the user where in their code it is (every
        STILL_RUNNING_SECONDS: a progress notification, a log line and a hint at the line)."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(STILL_RUNNING_SECONDS)
            frame = await self.worker.where(str(state.root))
            if frame is None:
                continue
            seconds = time.monotonic() - started
            text = linecache.getline(frame.file, frame.line).strip()
            site = Site(frame.file, frame.line, code=text, function=frame.function)
            self.running_at = (state, check, site, seconds)
            where = f"{os.path.basename(frame.file)}:{frame.line} in {frame.function}"
            log.info("%s is still running after %.0f s, at %s", check, seconds, where)
            # the stage the run last reported stays what the status item shows; where it is, beside it
            self.notify_client(
                PROGRESS, {**self.last_progress, "where": f"still running after {seconds:.0f} s at {where}"}
            )
            self.publish()

    @staticmethod
    def summary_of(result: CheckResult, mode: str) -> dict[str, Any]:
        return {
            "check": result.name,
            "mode": mode,
            "verdict": result.verdict,
            "worldSizes": [
                {"worldSize": r.world_size, "verdict": r.verdict, "summary": r.summary} for r in result.results
            ],
            # each finding once, however many world sizes show it: as many as its squiggles
            "discrepancies": len(diag.merge_world_sizes(result)),
            "unproven": len(diag.merge_world_sizes(result, unproven=True)),
            "error": result.error["message"] if result.error else None,
        }

    # -- diagnostics ------------------------------------------------------------------------------------
    def publish(self) -> None:
        by_file: dict[str, list[types.Diagnostic]] = {}
        for state in self.projects:
            pyproject = str(state.pyproject)
            by_file.setdefault(_real(pyproject), [])
            if state.config_error is not None:
                error = state.config_error
                site = {"file": error.site.file, "line": error.site.line} if error.site else None
                fd = diag._error(
                    "[tool.shardproof]",
                    {"message": error.message, "site": site, "kind": "ConfigError"},
                    self.text_of,
                    pyproject,
                    1,
                    None,
                )
                by_file.setdefault(_real(fd.path), []).append(fd.diagnostic)
                continue  # results of the previous declaration no longer apply
            for name, (mode, result) in state.results.items():
                for path in state.dependencies.get(name, set()):
                    by_file.setdefault(_real(path), [])
                for fd in diag.for_check(result, mode, self.text_of, pyproject, state.check_line(name)):
                    by_file.setdefault(_real(fd.path), []).append(fd.diagnostic)
            for name, reason in state.failures.items():
                site = state.failure_sites.get(name)
                fd = diag.worker_problem(name, reason, pyproject, state.check_line(name), self.text_of, site)
                by_file.setdefault(_real(fd.path), []).append(fd.diagnostic)
        if self.running_at is not None:
            _, check, site, seconds = self.running_at
            fd = diag.still_running(check, seconds, site, self.text_of)
            by_file.setdefault(_real(fd.path), []).append(fd.diagnostic)
        uris: set[str] = set()
        for path, found in by_file.items():
            uri = from_fs_path(path)
            if uri is None:
                continue
            uris.add(uri)
            document = self.workspace.text_documents.get(uri)
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri=uri, diagnostics=diag.merge_errors(found), version=document.version if document else None
                )
            )
        for uri in self.published - uris:
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
        self.published = uris

    def find_discrepancy(self, data: Any) -> tuple[ProjectState, str, Discrepancy, list[int]] | None:
        """By `discrepancyId` (a diagnostic's data), or by location: {"discrepancyIdFor": {uri, line, code}}."""
        if not isinstance(data, dict):
            return None
        wanted = data.get("discrepancyId")
        where = data.get("discrepancyIdFor")
        if wanted is None and isinstance(where, dict):
            wanted = self._discrepancy_at(str(where.get("uri", "")), int(where.get("line", -1)), where.get("code"))
        for state in self.projects:
            for name, (_, result) in state.results.items():
                sizes = [r.world_size for r in result.results if any(d.id == wanted for d in _findings(r))]
                for r in result.results:
                    for d in _findings(r):
                        if d.id == wanted:
                            return state, name, d, sizes
        return None

    def _discrepancy_at(self, uri: str, line: int, code: Any) -> str | None:
        path = to_fs_path(uri)
        if path is None:
            return None
        for state in self.projects:
            for _, result in state.results.values():
                for world in result.results:
                    for d in _findings(world):
                        if d.primary is None or not diag.same_file(d.primary.file, path):
                            continue
                        span = diag.to_range(d.primary, self.text_of(d.primary.file))
                        shown_code = "unproven" if d in world.unproven else d.kind
                        if span.start.line <= line <= span.end.line and code in (None, shown_code, d.kind):
                            return d.id
        return None

    def explanation(self, data: Any) -> dict[str, Any] | None:
        found = self.find_discrepancy(data)
        if found is None:
            return None
        state, name, d, sizes = found
        return {
            "discrepancyId": d.id,
            "check": name,
            "worldSizes": sizes,
            "kind": "unproven" if d.details.get("suspected") else d.kind,
            "verdict": "unproven" if d.details.get("suspected") else "discrepancy",
            "markdown": explain(d, name, sizes, state.root),
            "svg": picture(d),
        }

    def code_actions(self, params: types.CodeActionParams) -> list[types.CodeAction]:
        actions: list[types.CodeAction] = []
        for diagnostic in params.context.diagnostics:
            if diagnostic.source != diag.SOURCE:
                continue
            explanation = self.explanation(diagnostic.data)
            found = self.find_discrepancy(diagnostic.data)
            if explanation is None or found is None:
                continue
            actions.append(
                types.CodeAction(
                    title="Explain discrepancy",
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diagnostic],
                    command=types.Command(
                        title="Explain discrepancy", command=CLIENT_CMD_EXPLAIN, arguments=[explanation]
                    ),
                )
            )
            d = found[2]
            text = self.text_of(d.primary.file) if d.primary else None
            edits = mechanical_fix(d, text) if text is not None else None
            if edits and d.primary is not None:
                uri = Path(d.primary.file).as_uri()
                lines = text.splitlines() if text else []
                text_edits = [types.TextEdit(range=_span_range(e.span, lines), new_text=e.new_text) for e in edits]
                fix = d.details.get("fix", {})
                actions.append(
                    types.CodeAction(
                        title=str(fix.get("title", "Fix")),
                        kind=types.CodeActionKind.QuickFix,
                        diagnostics=[diagnostic],
                        is_preferred=True,
                        edit=types.WorkspaceEdit(changes={uri: text_edits}),
                    )
                )
        return actions

    # -- full model ---------------------------------------------------------------------------------------
    async def verify_full_model(self, client_token: str | None = None) -> dict[str, Any]:
        """Every check at every declared world size, full configuration (full_model.py)."""
        from .full_model import verify_full_model

        return await verify_full_model(self, client_token)


def _findings(world: WorldSizeResult) -> list[Discrepancy]:
    """A world size's shown discrepancies and its unproven findings (both get diagnostics)."""
    return [*world.discrepancies, *world.unproven]


def _span_range(span: Any, lines: list[str]) -> types.Range:
    from ..source_map import utf16_column

    def position(line: int, column: int) -> types.Position:
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return types.Position(line - 1, utf16_column(text, column))

    return types.Range(position(span.line, span.column), position(span.end_line, span.end_column))
