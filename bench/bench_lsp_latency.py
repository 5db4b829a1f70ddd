"""Edit-to-diagnostic latency of the language server on the bundled example's quick configuration.

    python bench/bench_lsp_latency.py [--edits 12] [--debounce-ms 600]

Starts `python -m shardproof.server` over stdio on a copy of examples/llama, waits for the first
verification, then alternates the attention output projection between correct and missing its
all-reduce. Each edit is timed from `textDocument/didChange` to the `publishDiagnostics` that
reflects it (a squiggle appears, or disappears). Prints the median and the maximum.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "llama"
GOOD = "return reduce_from_tp(F.linear(x, self.weight)) + self.bias"
BAD = "return F.linear(x, self.weight) + self.bias"


async def run(edits: int, debounce_ms: int) -> list[float]:
    workspace = Path(tempfile.mkdtemp(prefix="shardproof-latency-"))
    shutil.copytree(
        EXAMPLE / "llama_example", workspace / "llama_example", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(EXAMPLE / "pyproject.toml", workspace / "pyproject.toml")
    tp = workspace / "llama_example" / "tp.py"
    uri = tp.as_uri()
    client = LanguageClient()
    published: list[tuple[float, int]] = []  # (time, number of shardproof errors in tp.py)

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(_client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        if params.uri == uri:
            published.append((time.perf_counter(), len(params.diagnostics)))

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def on_register(_client: LanguageClient, params: types.RegistrationParams) -> None:
        return None

    for method in (
        "shardproof/workerStateChanged",
        "shardproof/verificationStarted",
        "shardproof/verificationFinished",
    ):
        client.feature(method)(lambda *_: None)

    await client.start_io(sys.executable, "-m", "shardproof.server")
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="latency")],
            initialization_options={"debounceMs": debounce_ms, "run": "onType"},
        )
    )
    text = tp.read_text()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        )
    )
    while not published:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    latencies: list[float] = []
    for i in range(edits):
        buggy = i % 2 == 0
        new_text = text.replace(GOOD, BAD) if buggy else text
        seen = len(published)
        start = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=i + 2),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=new_text)],
            )
        )
        while True:
            fresh = published[seen:]
            hit = next((t for t, count in fresh if (count > 0) == buggy), None)
            if hit is not None:
                latencies.append(hit - start)
                break
            await asyncio.sleep(0.01)
        print(f"edit {i + 1}: {'bug' if buggy else 'fix'} -> {latencies[-1]:.2f} s", file=sys.stderr)
        await asyncio.sleep(0.5)
    await client.shutdown_session()
    shutil.rmtree(workspace, ignore_errors=True)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edits", type=int, default=12)
    parser.add_argument("--debounce-ms", type=int, default=600)
    args = parser.parse_args()
    latencies = asyncio.run(run(args.edits, args.debounce_ms))
    print(f"edits: {len(latencies)}, debounce {args.debounce_ms} ms")
    print(f"median edit-to-diagnostic latency: {statistics.median(latencies):.2f} s")
    print(f"max: {max(latencies):.2f} s, min: {min(latencies):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
