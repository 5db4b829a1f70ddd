"""Edit-to-diagnostic latency of the language server.

    python bench/bench_lsp_latency.py [--edits 12] [--debounce-ms 600]
    python bench/bench_lsp_latency.py --full-405b [--edits 12]

Starts `python -m shardproof.server` over stdio, waits for the first (cold) verification, then
alternates the row-parallel linear's forward (every block's attention output and MLP down
projection) between correct and missing its all-reduce. Each edit is timed from
`textDocument/didChange` to the `publishDiagnostics` that reflects it (a finding appears in
tp.py, or disappears). Prints the cold time, the maximum and minimum, and the median last.
The edits toggle between two versions: the cold run's and the first edit's. Only the first edit
makes a version the server has not seen (every rank whose files changed is captured again); every
later one returns to a version whose rank captures are stored (capture/capture_cache.py), so the
first edit is printed apart.

Default: a copy of examples/llama, with the editor verifying each check's quick configuration
(1 layer, hidden 64, world size 2), as the editor did before it verified full declarations.
`--full-405b`: bench_scale.py's project (the example's model with the Llama-3.1-405B
configuration through its SCALE_* variables, 126 layers) declaring only its tensor-parallel check
at TP=8; the editor verifies that full declaration. The saturation cache starts empty in a
directory of the run's own, as a user's first session would.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
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
# diagnostics that say nothing about the code's correctness: a hint at the line a long run
# executes, a run the worker could not finish
NOT_FINDINGS = {"still-running", "worker-failed"}


def small_example(workspace: Path) -> tuple[Path, dict[str, str], dict[str, object]]:
    shutil.copytree(
        EXAMPLE / "llama_example", workspace / "llama_example", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(EXAMPLE / "pyproject.toml", workspace / "pyproject.toml")
    return workspace / "llama_example" / "tp.py", {}, {"editorConfiguration": "quick"}


def full_405b(workspace: Path) -> tuple[Path, dict[str, str], dict[str, object]]:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_scale

    bench_scale.write_project(workspace, checks=("tp",))
    env = {f"SCALE_{k.upper()}": str(v) for k, v in bench_scale.LLAMA_405B.items()}
    env["SCALE_LAYERS"] = "126"
    env["SHARDPROOF_CACHE_DIR"] = str(workspace / ".shardproof-cache")
    # a run captures 126 layers at 8 ranks (a discrepancy is localized in the block that fails,
    # memoized_failure.py): measure it however long it takes, rather than stop it at the default limit
    return (
        workspace / "example" / "llama_example" / "tp.py",
        env,
        {"editorConfiguration": "full", "workerTimeoutSeconds": 3600},
    )


async def run(edits: int, debounce_ms: int, large: bool, edit_timeout: float) -> tuple[float, list[float]]:
    workspace = Path(tempfile.mkdtemp(prefix="shardproof-latency-"))
    tp, env, options = (full_405b if large else small_example)(workspace)
    uri = tp.as_uri()
    client = LanguageClient()
    published: list[tuple[float, int]] = []  # (time, number of shardproof findings in tp.py)
    finished: list[tuple[int, dict[str, object]]] = []  # (publishes of tp.py received before it, summary)

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(_client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        if params.uri == uri:
            findings = [d for d in params.diagnostics if d.code not in NOT_FINDINGS]
            published.append((time.perf_counter(), len(findings)))

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def on_register(_client: LanguageClient, params: types.RegistrationParams) -> None:
        return None

    @client.feature("shardproof/verificationFinished")
    def on_finished(_client: LanguageClient, params: object) -> None:
        summary = params._asdict() if hasattr(params, "_asdict") else {}  # type: ignore[attr-defined]
        finished.append((len(published), summary))

    for method in (
        "shardproof/workerStateChanged",
        "shardproof/verificationStarted",
        "shardproof/progress",
        types.WINDOW_LOG_MESSAGE,
    ):
        client.feature(method)(lambda *_: None)

    start = time.perf_counter()
    await client.start_io(sys.executable, "-m", "shardproof.server", env={**os.environ, **env})
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="latency")],
            initialization_options={"debounceMs": debounce_ms, "run": "onType", **options},
        )
    )
    text = tp.read_text()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        )
    )
    while not finished:
        await asyncio.sleep(0.05)
    cold = time.perf_counter() - start
    verdict = finished[-1][1].get("verdict")
    print(f"cold run (server start to the first result): {cold:.2f} s, {verdict}", file=sys.stderr)
    await asyncio.sleep(1.0)
    latencies: list[float] = []  # math.inf: not reflected within edit_timeout
    for i in range(edits):
        buggy = i % 2 == 0
        new_text = text.replace(GOOD, BAD) if buggy else text
        seen = len(finished)
        start = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=i + 2),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=new_text)],
            )
        )
        latency = math.inf
        while edit_timeout <= 0 or time.perf_counter() - start < edit_timeout:
            hit = next((r for r in finished[seen:] if reflects(r[1], buggy)), None)
            if hit is not None:
                # the server publishes a result's diagnostics, then says it finished: the last
                # publish of tp.py before that notification is the one that shows the edit
                when, count = published[hit[0] - 1]
                assert (count > 0) == buggy, f"the result reflects the edit but tp.py shows {count} findings"
                latency = when - start
                break
            await asyncio.sleep(0.01)
        latencies.append(latency)
        shown = f"{latency:.2f} s" if latency < math.inf else f"not reflected within {edit_timeout:g} s"
        print(f"edit {i + 1}: {'bug' if buggy else 'fix'} -> {shown}", file=sys.stderr)
        await asyncio.sleep(0.5)
    await client.shutdown_session()
    shutil.rmtree(workspace, ignore_errors=True)
    return cold, latencies


def reflects(summary: dict[str, object], buggy: bool) -> bool:
    """Whether a finished verification's summary shows the edit: a finding after the missing
    all-reduce, a proof after the fix (a result of an earlier version is never sent: the server
    drops stale results)."""
    findings = int(summary.get("discrepancies") or 0) + int(summary.get("unproven") or 0)
    return findings > 0 if buggy else summary.get("verdict") == "verified"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edits", type=int, default=12)
    parser.add_argument("--debounce-ms", type=int, default=600)
    parser.add_argument(
        "--full-405b",
        action="store_true",
        help="the 405B-shape tensor-parallel check (126 layers, TP=8), full declaration",
    )
    parser.add_argument(
        "--edit-timeout",
        type=float,
        default=0.0,
        help="seconds after which an edit not yet reflected counts as not reflected (0: wait)",
    )
    args = parser.parse_args()
    cold, latencies = asyncio.run(run(args.edits, args.debounce_ms, args.full_405b, args.edit_timeout))
    what = "405B shape, 126 layers, TP=8, full declaration" if args.full_405b else "bundled example, quick"
    print(f"{what}: edits: {len(latencies)}, debounce {args.debounce_ms} ms")
    print(f"cold run: {cold:.2f} s")

    def shown(values: list[float]) -> str:
        middle = statistics.median(values)
        return f"{middle:.2f} s" if middle < math.inf else f"> {args.edit_timeout:g} s"

    # the edits alternate: a missing all-reduce (a discrepancy to find), then the fix (a proof)
    bugs, fixes = latencies[0::2], latencies[1::2]
    print(
        f"median of the {len(bugs)} bug edits: {shown(bugs)}"
        + (f", of the {len(fixes)} fix edits: {shown(fixes)}" if fixes else "")
    )
    if latencies:
        # edit 1 makes a version the server has not seen (every rank whose files changed is
        # captured again); every later edit returns to the cold run's version or to edit 1's,
        # whose rank captures are stored (capture/capture_cache.py)
        print(f"first edit (a version not seen before, every rank captured): {shown(latencies[:1])}")
    longest = max(latencies)
    print(f"max: {longest:.2f} s" if longest < math.inf else f"max: > {args.edit_timeout:g} s", end="")
    print(f", min: {min(latencies):.2f} s")
    late = [x for x in latencies if x == math.inf]
    if late:
        # an edit not reflected in time counts as at least edit_timeout: the median is a lower bound
        bounded = [min(x, args.edit_timeout) for x in latencies]
        print(
            f"median edit-to-diagnostic latency: >= {statistics.median(bounded):.2f} s "
            f"({len(late)} of {len(latencies)} edits not reflected within {args.edit_timeout:g} s)"
        )
    else:
        print(f"median edit-to-diagnostic latency: {statistics.median(latencies):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
