"""LSP methods -> server state. Glue only: every handler translates and delegates."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from lsprotocol import types
from pygls.uris import to_fs_path

from .client_log import log_to_client
from .server import CMD_EXPLAIN, CMD_VERIFY_FULL_MODEL, ShardproofLanguageServer

log = logging.getLogger("shardproof.server")


def _apply_log_level(level: str) -> None:
    numeric = {
        "error": logging.ERROR,
        "warning": logging.WARNING,
        "info": logging.INFO,
        "debug": logging.DEBUG,
        "trace": logging.DEBUG,
        "off": logging.CRITICAL,
    }.get(level, logging.INFO)
    logging.getLogger("shardproof").setLevel(numeric)


def register(server: ShardproofLanguageServer) -> None:
    @server.feature(types.INITIALIZE)
    def initialize(ls: ShardproofLanguageServer, params: types.InitializeParams) -> None:
        log_to_client(ls)  # the spec allows window/logMessage while initialize is answered
        settings, problems = ls.settings.from_options(params.initialization_options)
        ls.settings = settings
        _apply_log_level(settings.log_level)
        for problem in problems:
            log.warning("%s (using the default)", problem)
        folders = [to_fs_path(f.uri) for f in params.workspace_folders or []]
        if not folders and params.root_uri:
            folders = [to_fs_path(params.root_uri)]
        ls.folders = [f for f in folders if f]
        log.info(
            "shardproof %s starting: cwd %s, python %s, settings %s, folders %s",
            ls.version,
            os.getcwd(),
            os.sys.executable,
            settings,
            ls.folders,
        )

    @server.feature(types.INITIALIZED)
    async def initialized(ls: ShardproofLanguageServer, params: types.InitializedParams) -> None:
        ls.discover(getattr(ls, "folders", []))
        ls.publish()
        if not ls.projects:
            log.info("no [tool.shardproof] declaration in the workspace")
            ls.message(
                types.MessageType.Info,
                "shardproof: no pyproject.toml with a [tool.shardproof] declaration "
                "in this workspace; nothing to verify",
            )
            return
        await _watch_files(ls)
        ls.schedule_all()

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: ShardproofLanguageServer, params: Any) -> None:
        for task in list(ls.pending.values()):
            task.cancel()
        await ls.worker.stop()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: ShardproofLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.publish()  # stamp this document's diagnostics with its version

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: ShardproofLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        path = to_fs_path(params.text_document.uri)
        if path is not None:
            ls.closed(path)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: ShardproofLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        path = to_fs_path(params.text_document.uri)
        if path is None:
            return
        if _is_declaration(ls, path):
            _reload(ls, path, delay=ls.settings.debounce_ms / 1000 if ls.settings.run == "onType" else None)
            return
        if ls.settings.run != "onType":
            return
        for state, check in ls.affected(path):
            ls.schedule(state, check, ls.settings.debounce_ms / 1000)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: ShardproofLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        path = to_fs_path(params.text_document.uri)
        if path is None:
            return
        if _is_declaration(ls, path):
            _reload(ls, path, delay=0.0)
            return
        for state, check in ls.affected(path):
            ls.schedule(state, check, 0.0)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: ShardproofLanguageServer, params: types.DidChangeWatchedFilesParams) -> None:
        for change in params.changes:
            path = to_fs_path(change.uri)
            if path is None:
                continue
            if path.endswith("pyproject.toml"):
                _reload(ls, path, delay=0.0, create=True)
                continue
            if ls.workspace.text_documents.get(change.uri) is not None:
                continue  # the editor buffer is the truth for open files
            for state, check in ls.affected(path):
                ls.schedule(state, check, 0.0)

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: ShardproofLanguageServer, params: types.DidChangeConfigurationParams) -> None:
        before = ls.settings
        settings, problems = ls.settings.from_options(params.settings, ls.settings)
        ls.settings = settings
        _apply_log_level(settings.log_level)
        log.info("settings changed: %s", settings)
        for problem in problems:
            ls.message(types.MessageType.Warning, f"shardproof: {problem}; keeping {ls.settings}")
        if settings.editor_configuration != before.editor_configuration:
            ls.editor_configuration_changed()

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix])
    )
    def code_action(ls: ShardproofLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return ls.code_actions(params)

    @server.command(CMD_EXPLAIN)
    def explain_discrepancy(ls: ShardproofLanguageServer, *args: Any) -> dict[str, Any] | None:
        data = args[0] if args else None
        if isinstance(data, str):
            data = {"discrepancyId": data}
        return ls.explanation(data)

    @server.command(CMD_VERIFY_FULL_MODEL)
    async def verify_full_model(ls: ShardproofLanguageServer, *args: Any) -> dict[str, Any]:
        options = args[0] if args and isinstance(args[0], dict) else {}
        token = options.get("progressToken")
        return await ls.verify_full_model(str(token) if token else None)


def _is_declaration(ls: ShardproofLanguageServer, path: str) -> bool:
    return path.endswith("pyproject.toml") and any(
        os.path.realpath(path) == os.path.realpath(str(s.pyproject)) for s in ls.projects
    )


def _reload(ls: ShardproofLanguageServer, path: str, delay: float | None, create: bool = False) -> None:
    states = [s for s in ls.projects if os.path.realpath(str(s.pyproject)) == os.path.realpath(path)]
    if not states and create:
        ls.discover([os.path.dirname(path)])
        states = [s for s in ls.projects if os.path.realpath(str(s.pyproject)) == os.path.realpath(path)]
    for state in states:
        ls.load(state)
        ls.publish()
        if delay is not None:
            for name in state.check_names():
                ls.schedule(state, name, delay)


async def _watch_files(ls: ShardproofLanguageServer) -> None:
    """Ask the client to tell us about files changed outside the editor (git checkout, other tools)."""
    capabilities = ls.client_capabilities.workspace
    watched = capabilities.did_change_watched_files if capabilities else None
    if watched is None or not watched.dynamic_registration:
        return
    options = types.DidChangeWatchedFilesRegistrationOptions(
        watchers=[
            types.FileSystemWatcher(glob_pattern="**/*.py"),
            types.FileSystemWatcher(glob_pattern="**/pyproject.toml"),
        ]
    )
    registration = types.Registration(
        id="shardproof-watched-files", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES, register_options=options
    )
    try:
        await asyncio.wait_for(ls.client_register_capability_async(types.RegistrationParams([registration])), 10)
    except Exception as exc:  # noqa: BLE001 - watching is an optimisation; editing still works without it
        log.warning("could not register file watchers: %s", exc)
