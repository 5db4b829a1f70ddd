"""A real LSP client (pytest-lsp) talking to `python -m shardproof.server` over stdio."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

SERVER = [sys.executable, "-m", "shardproof.server"]


def workspace_fixture(name: str, variant: str | None, options: dict | None = None, extra: dict | None = None):
    """A pytest-lsp client fixture on a fresh copy of the example (optionally with a bug)."""

    @pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
    async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
        import bug_variants

        root = tmp_path_factory.mktemp(name)
        if variant is None:
            import shutil

            shutil.copytree(bug_variants.HERE / "llama_example", root / "llama_example")
            shutil.copy(bug_variants.HERE / "pyproject.toml", root / "pyproject.toml")
        else:
            bug_variants.materialize(bug_variants.variant(variant), root)
        for relative, text in (extra or {}).items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
        await _session(lsp_client, root, name, options)
        yield
        await lsp_client.shutdown_session()

    return client


def plain(value: object) -> object:
    """pygls hands untyped JSON over as nested namedtuples; tests want dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}  # type: ignore[attr-defined]
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


async def wait_for(
    predicate: Callable[[], object], timeout: float = 120.0, step: float = 0.05, client: LanguageClient | None = None
) -> object:
    """Wait until predicate() is truthy (while the client processes server messages)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(step)
    seen = ""
    if client is not None:
        seen = "; diagnostics: " + repr(
            {
                uri.rsplit("/", 1)[-1]: [(d.code, d.message[:120], d.range.start.line) for d in ds]
                for uri, ds in client.diagnostics.items()
            }
        )
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {predicate}{seen}")


def diagnostics_of(client: LanguageClient, path: Path) -> list[types.Diagnostic]:
    return list(client.diagnostics.get(path.as_uri(), []))


def open_document(client: LanguageClient, path: Path, version: int = 1) -> str:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=path.read_text())
        )
    )
    return uri


def replace_document(client: LanguageClient, path: Path, text: str, version: int) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=path.as_uri(), version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"


def tiny_project(root: Path, checks: list[str]) -> None:
    """A copy of the tiny fixture at `root` declaring only `checks` (blocks of its pyproject.toml)."""
    import shutil

    shutil.copytree(TINY / "tinymlp", root / "tinymlp", ignore=shutil.ignore_patterns("__pycache__"))
    text = (TINY / "pyproject.toml").read_text()
    head, *blocks = text.split("[[tool.shardproof.check]]")
    kept = [b for b in blocks if any(f'name = "{name}"\n' in b for name in checks)]
    (root / "pyproject.toml").write_text(head + "".join("[[tool.shardproof.check]]" + b for b in kept))


def tiny_fixture(name: str, checks: list[str], options: dict | None = None, extra: dict | None = None):
    """A pytest-lsp client fixture on a copy of the tiny fixture with only `checks` declared, and
    `extra` files (relative path -> text; a pyproject.toml entry is appended to the declaration)."""

    @pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
    async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
        root = tmp_path_factory.mktemp(name)
        tiny_project(root, checks)
        for relative, text in (extra or {}).items():
            target = root / relative
            target.write_text((target.read_text() if relative == "pyproject.toml" else "") + text)
        await _session(lsp_client, root, name, options)
        yield
        await lsp_client.shutdown_session()

    return client


async def _session(lsp_client: LanguageClient, root: Path, name: str, options: dict | None) -> None:
    """Record what the server tells the client (registrations, shardproof's own notifications) and
    initialize a session on the workspace `root`."""
    lsp_client.root = root  # type: ignore[attr-defined]
    registrations: list[types.RegistrationParams] = []
    lsp_client.registrations = registrations  # type: ignore[attr-defined]

    @lsp_client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register_capability(_client: LanguageClient, params: types.RegistrationParams) -> None:
        registrations.append(params)

    in_order: list[tuple[str, object]] = []  # every shardproof notification, as (method, params)
    lsp_client.shardproof_notifications = in_order  # type: ignore[attr-defined]
    for method in (
        "shardproof/workerStateChanged",
        "shardproof/verificationStarted",
        "shardproof/verificationFinished",
        "shardproof/progress",
    ):
        events: list[object] = []
        setattr(lsp_client, method.split("/")[1], events)

        @lsp_client.feature(method)
        def record(
            _client: LanguageClient, params: object, events: list[object] = events, method: str = method
        ) -> None:
            events.append(plain(params))
            in_order.append((method.split("/")[1], events[-1]))

    params = types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=name)],
        initialization_options=options or {"debounceMs": 200},
    )
    await lsp_client.initialize_session(params)
