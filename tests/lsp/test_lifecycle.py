"""Document lifecycle edge cases a real editor produces: changes to documents it never opened,
results of buffers that were closed, a project opened without typing."""

from __future__ import annotations

import asyncio

import pytest
from lsp_helpers import diagnostics_of, open_document, replace_document, tiny_fixture, wait_for
from lsprotocol import types

pytestmark = pytest.mark.slow

tiny = tiny_fixture("lifecycle", ["ok"])


async def test_a_change_to_a_document_never_opened_is_no_popup(tiny) -> None:
    client = tiny
    parallel = client.root / "tinymlp/parallel.py"
    replace_document(client, parallel, parallel.read_text() + "\n", 5)  # never opened
    await asyncio.sleep(1.0)
    assert not [m for m in client.messages if "Error in server" in m.message], client.messages
    assert any("never opened" in m.message for m in client.log_messages), [m.message for m in client.log_messages]
    open_document(client, parallel)  # the server still serves
    await wait_for(lambda: parallel.as_uri() in client.diagnostics, timeout=30, client=client)
    assert not diagnostics_of(client, parallel)


async def test_closing_an_unsaved_buffer_withdraws_what_was_found_in_it(tiny) -> None:
    client = tiny
    parallel = client.root / "tinymlp/parallel.py"
    open_document(client, parallel)
    await wait_for(lambda: parallel.as_uri() in client.diagnostics and client.verificationFinished, client=client)
    text = parallel.read_text()
    assert text.count("        dist.all_reduce(y)\n") >= 1
    broken = text.replace("        dist.all_reduce(y)\n", "", 1)  # the correct MLP loses its all-reduce
    replace_document(client, parallel, broken, 2)
    await wait_for(lambda: [d for d in diagnostics_of(client, parallel) if d.severity == 1], client=client)
    # diagnostics are published before the run's verificationFinished: wait for the broken run's own
    # notification, so the one awaited below can only be the run on the file on disk
    await wait_for(lambda: client.verificationFinished[-1]["verdict"] == "discrepancy", client=client)
    finished_before_close = len(client.verificationFinished)
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=parallel.as_uri()))
    )
    # the file on disk is correct: the squiggle found in the unsaved buffer goes away
    await wait_for(
        lambda: (
            len(client.verificationFinished) > finished_before_close
            and client.verificationFinished[-1]["verdict"] == "verified"
        ),
        client=client,
    )
    assert not diagnostics_of(client, parallel)


shared_error = tiny_fixture("shared-error", ["ok", "column-only"])


async def test_an_error_every_check_hits_is_one_squiggle_naming_the_checks(shared_error) -> None:
    client = shared_error
    parallel = client.root / "tinymlp/parallel.py"
    open_document(client, parallel)
    await wait_for(lambda: len(client.verificationFinished) >= 2, client=client)
    broken = parallel.read_text().replace("def parallel_ok(", "def parallel_ok(:", 1)  # a syntax error
    replace_document(client, parallel, broken, 2)
    found = await wait_for(
        lambda: (
            [d for d in diagnostics_of(client, parallel) if d.code == "user-code-error"]
            if sum(e["verdict"] == "error" for e in client.verificationFinished) >= 2
            else None
        ),
        client=client,
    )
    (diagnostic,) = found
    assert "checks ok, column-only" in diagnostic.message or "checks column-only, ok" in diagnostic.message


HANG = """
from .parallel import ParallelMLP


def parallelize(ref, rank, world_size):
    while True:
        pass
    return ParallelMLP(ref, rank, world_size)
"""
HANG_CHECK = """
[[tool.shardproof.check]]
name = "never-returns"
reference = "tinymlp.model:build"
parallel = "tinymlp.hang:parallelize"
inputs = "tinymlp.model:inputs"
world-sizes = [2]
"""
hang = tiny_fixture(
    "hang",
    [],
    options={"debounceMs": 200, "workerTimeoutSeconds": 25},
    extra={"tinymlp/hang.py": HANG, "pyproject.toml": HANG_CHECK},
)


async def test_a_builder_that_never_returns_is_shown_where_it_runs(hang) -> None:
    client = hang
    source = client.root / "tinymlp/hang.py"
    loop_line = next(i for i, line in enumerate(source.read_text().splitlines()) if line.strip() == "pass")
    open_document(client, source)
    # within seconds: a hint at the line the verification is executing
    hint = await wait_for(
        lambda: [d for d in diagnostics_of(client, source) if d.code == "still-running"], timeout=20, client=client
    )
    assert hint[0].range.start.line in (loop_line - 1, loop_line)
    assert "still running here" in hint[0].message
    # at the timeout: the check is reported at that line, not at its declaration
    stopped = await wait_for(
        lambda: [d for d in diagnostics_of(client, source) if d.code == "worker-failed"], timeout=60, client=client
    )
    assert stopped[0].range.start.line in (loop_line - 1, loop_line)
    assert "while it was running hang.py" in stopped[0].message
