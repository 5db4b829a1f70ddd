"""Editing sharding code: newer edits win, explanations and quick fixes, bad input, worker crashes."""

from __future__ import annotations

import os
import signal

import pytest
from lsp_helpers import diagnostics_of, open_document, plain, replace_document, wait_for, workspace_fixture
from lsprotocol import types

pytestmark = pytest.mark.slow

# These tests are about edits superseding runs, explanations, fixes and failures, not about what is
# verified: the example's quick configuration keeps them fast. The editor's default, the full
# declaration, is tested in test_editor_configuration.py, test_diagnostics.py and the VS Code e2e.
QUICK = {"debounceMs": 200, "editorConfiguration": "quick"}
example = workspace_fixture("example", None, QUICK)
missing = workspace_fixture("missing-fix", "missing-all-reduce", QUICK)

ORIGINAL = "return reduce_from_tp(F.linear(x, self.weight)) + self.bias"
MISSING = "return F.linear(x, self.weight) + self.bias"
BIAS_INSIDE = "return reduce_from_tp(F.linear(x, self.weight) + self.bias)"


def _finished(client) -> list[dict]:
    return list(client.verificationFinished)


def _command_of(action) -> tuple[str, list]:
    """The command of a code action. pytest-lsp structures `Command | CodeAction` replies with a
    cattrs union hook that can turn a code action carrying a command into a `Command` whose
    `command` field holds the nested command as text; read it back from there."""
    import ast

    if isinstance(action, types.CodeAction):
        return action.command.command, list(action.command.arguments or [])
    if isinstance(action.command, str) and action.command.startswith("{"):
        nested = ast.literal_eval(action.command)
        return nested["command"], nested.get("arguments", [])
    return action.command, list(action.arguments or [])


async def _first_run(client, path) -> None:
    await wait_for(lambda: path.as_uri() in client.diagnostics and _finished(client))


async def test_a_newer_edit_cancels_the_running_verification(example) -> None:
    client = example
    tp = client.root / "llama_example/tp.py"
    open_document(client, tp)
    await _first_run(client, tp)
    assert not diagnostics_of(client, tp)
    started = len(client.verificationStarted)
    finished = len(_finished(client))
    replace_document(client, tp, tp.read_text().replace(ORIGINAL, MISSING), 2)
    await wait_for(lambda: len(client.verificationStarted) > started)  # version 2 is being verified
    replace_document(client, tp, tp.read_text().replace(ORIGINAL, BIAS_INSIDE), 3)
    # the server publishes a run's diagnostics, then says it finished: wait for both (under load the
    # notification may be read a moment after the diagnostics)
    await wait_for(
        lambda: (
            {d.code for d in diagnostics_of(client, tp)} == {"bias-before-reduction"}
            and any(e["verdict"] == "discrepancy" for e in _finished(client)[finished:])
        )
    )
    later = _finished(client)[finished:]
    assert later and all("partial sum of the linear" not in w["summary"] for e in later for w in e["worldSizes"]), (
        "the superseded run (missing all-reduce) must not publish"
    )


async def test_explain_and_quick_fix_make_the_check_pass(missing) -> None:
    client = missing
    tp = client.root / "llama_example/tp.py"
    open_document(client, tp)
    (diagnostic,) = await wait_for(lambda: [d for d in diagnostics_of(client, tp) if d.code == "missing-reduction"])
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=tp.as_uri()),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    titles = [a.title for a in actions]
    assert titles[0] == "Explain discrepancy"
    command_id, arguments = _command_of(actions[0])
    assert command_id == "shardproof.explainDiscrepancy"
    explanation = plain(arguments[0])
    markdown = explanation["markdown"]
    assert "What the reference computes" in markdown and "model.py:104" in markdown
    # With editorConfiguration "quick", the check runs its quick configuration (dim 64, world size 2).
    assert "rank 0: a partial sum over its half of the 64 input features" in markdown
    assert explanation["svg"].startswith("<svg") and "reduce" in explanation["svg"]
    assert "Suggested fix" in markdown
    again = plain(
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.explainDiscrepancy", arguments=[diagnostic.data])
        )
    )
    assert again["markdown"] == markdown  # answered from the stored result

    (fix,) = [a for a in actions if getattr(a, "edit", None) is not None]
    assert fix.is_preferred and "reduce_from_tp" in fix.title
    (edit,) = fix.edit.changes[tp.as_uri()]
    lines = tp.read_text().splitlines(keepends=True)
    line = lines[edit.range.start.line]
    lines[edit.range.start.line] = line[: edit.range.start.character] + edit.new_text + line[edit.range.end.character :]
    fixed = "".join(lines)
    assert ORIGINAL in fixed
    replace_document(client, tp, fixed, 2)
    await wait_for(
        lambda: (
            tp.as_uri() in client.diagnostics
            and not diagnostics_of(client, tp)
            and _finished(client)[-1]["verdict"] == "verified"
        )
    )


async def test_full_model_command_reports_progress_and_a_summary(example) -> None:
    client = example
    result = plain(
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.verifyFullModel", arguments=[])
        )
    )
    assert result["cancelled"] is False and result["verified"] == 2  # llama-tp and llama-sp
    for check in result["checks"]:
        assert [w["worldSize"] for w in check["worldSizes"]] == [2, 4, 8]  # the full configuration
    (reports,) = list(client.progress_reports.values())
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].cancellable
    assert any(
        isinstance(r, types.WorkDoneProgressReport) and r.percentage and "world size 8" in r.message for r in reports
    )
    percentages = [r.percentage for r in reports if isinstance(r, types.WorkDoneProgressReport) and r.percentage]
    assert percentages == sorted(percentages)
    assert isinstance(reports[-1], types.WorkDoneProgressEnd)


async def test_cancelling_the_full_model_command_stops_the_work(example) -> None:
    client = example
    import asyncio

    task = asyncio.ensure_future(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.verifyFullModel", arguments=[])
        )
    )
    token = await wait_for(
        lambda: next(
            (
                t
                for t, r in client.progress_reports.items()
                if any(isinstance(x, types.WorkDoneProgressReport) for x in r)
            ),
            None,
        )
    )
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    result = plain(await asyncio.wait_for(task, timeout=30))
    assert result["cancelled"] is True
    assert isinstance(client.progress_reports[token][-1], types.WorkDoneProgressEnd)


async def test_bad_input_gives_diagnostics_and_the_server_keeps_serving(example) -> None:
    client = example
    root = client.root
    tp = root / "llama_example/tp.py"
    pyproject = root / "pyproject.toml"
    open_document(client, tp)
    await _first_run(client, tp)
    good = tp.read_text()
    lines = good.splitlines()

    def line_of(text: str, needle: str) -> int:
        return next(i for i, line in enumerate(text.splitlines()) if needle in line)

    cases = [
        ("syntax error mid-edit", good.replace("def shard(", "def shard(:"), "def shard(:", "SyntaxError"),
        (
            "import error",
            good.replace("from .model import", "from .modell import"),
            "from .modell import",
            "ModuleNotFoundError",
        ),
        (
            "exception in a builder",
            good.replace(
                "    model = model_class(cfg, rank, world_size)\n",
                "    model = model_class(cfg, rank, world_size)\n    raise RuntimeError('no shard for this rank')\n",
            ),
            "raise RuntimeError",
            "RuntimeError: no shard for this rank",
        ),
        (
            "untraceable model",
            good.replace(
                "        seq_len = tokens.shape[1]\n",
                "        seq_len = tokens.shape[1]\n        if tokens.sum() > 0:\n            seq_len = seq_len\n",
            ),
            "if tokens.sum() > 0:",
            "tracing rank",
        ),
    ]
    version = 1
    for name, text, needle, message in cases:
        version += 1
        replace_document(client, tp, text, version)
        found = await wait_for(
            lambda message=message: [
                d for d in diagnostics_of(client, tp) if d.code == "user-code-error" and message in d.message
            ],
            client=client,
        )
        assert found[0].range.start.line == line_of(text, needle), name
        assert found[0].severity == types.DiagnosticSeverity.Error
    version += 1
    replace_document(client, tp, good, version)
    await wait_for(
        lambda: not diagnostics_of(client, tp) and _finished(client)[-1]["verdict"] == "verified", client=client
    )
    del lines

    # A declaration naming a missing function, then a malformed declaration: diagnostics in pyproject.toml.
    open_document(client, pyproject)
    declaration = pyproject.read_text()
    # (the editor verifies the quick configuration, so break its reference)
    replace_document(client, pyproject, declaration.replace('model:build_quick"', 'model:build_missing"'), 2)
    found = await wait_for(
        lambda: [d for d in diagnostics_of(client, pyproject) if "build_missing" in d.message], client=client
    )
    assert found[0].range.start.line == line_of(declaration, 'reference = "llama_example.model:build_quick"')
    replace_document(client, pyproject, declaration.replace("world-sizes = [2, 4, 8]", "world-sizes = [0]"), 3)
    found = await wait_for(
        lambda: [
            d for d in diagnostics_of(client, pyproject) if d.code == "config-error" and "world-sizes" in d.message
        ],
        client=client,
    )
    assert len(diagnostics_of(client, pyproject)) == 1
    assert found[0].range.start.line == line_of(declaration, "world-sizes = [2, 4, 8]")
    replace_document(client, pyproject, declaration.split("[tool.shardproof]")[0], 4)
    found = await wait_for(
        lambda: [d for d in diagnostics_of(client, pyproject) if "no [tool.shardproof]" in d.message], client=client
    )
    assert found[0].range.start.line == 0
    replace_document(client, pyproject, declaration, 5)
    await wait_for(
        lambda: not diagnostics_of(client, pyproject) and _finished(client)[-1]["verdict"] == "verified", client=client
    )


def _busy_count(client) -> int:
    return sum(1 for event in client.workerStateChanged if event["state"] == "busy")


async def test_a_killed_worker_is_replaced_and_the_user_is_told(example) -> None:
    client = example
    tp = client.root / "llama_example/tp.py"
    open_document(client, tp)
    await _first_run(client, tp)
    states = [e for e in client.workerStateChanged if str(e["detail"]).startswith("pid ")]
    pid = int(states[-1]["detail"].split()[-1])
    # Let the first round end (every check, worker idle): a job of that round cancelled by the edit
    # would end at once and leave the worker idle when the kill arrives.
    await wait_for(
        lambda: (
            {f["check"] for f in _finished(client)} >= {"llama-tp", "llama-sp"}
            and client.workerStateChanged[-1]["state"] == "idle"
        )
    )
    busy_before = _busy_count(client)
    replace_document(client, tp, tp.read_text().replace(ORIGINAL, MISSING), 2)
    # Kill once the worker has the job: "verification started" is announced before the job is handed
    # over, and a worker killed in between dies idle, which is reported as a state, not to the user.
    await wait_for(lambda: _busy_count(client) > busy_before)
    os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: any("worker" in m.message for m in client.messages))
    pyproject = client.root / "pyproject.toml"
    await wait_for(lambda: [d for d in diagnostics_of(client, pyproject) if d.code == "worker-failed"])
    # The server keeps serving with a new worker: the next edit is verified.
    replace_document(client, tp, tp.read_text().replace(ORIGINAL, MISSING) + "\n", 3)
    await wait_for(lambda: {d.code for d in diagnostics_of(client, tp)} == {"missing-reduction"})
    assert not [d for d in diagnostics_of(client, pyproject) if d.code == "worker-failed"]


async def test_a_worker_that_dies_between_verifications_is_reported(example) -> None:
    client = example
    tp = client.root / "llama_example/tp.py"
    open_document(client, tp)
    await _first_run(client, tp)
    await wait_for(
        lambda: (
            {f["check"] for f in _finished(client)} >= {"llama-tp", "llama-sp"}
            and client.workerStateChanged[-1]["state"] == "idle"
        )
    )
    states = [e for e in client.workerStateChanged if str(e["detail"]).startswith("pid ")]
    pid = int(states[-1]["detail"].split()[-1])
    os.kill(pid, signal.SIGKILL)  # as the kernel's out-of-memory killer would, while nothing runs
    await wait_for(lambda: any("between verifications" in m.message for m in client.messages))
    (told,) = [m for m in client.messages if "between verifications" in m.message]
    assert "SIGKILL" in told.message, told.message
    # The next edit is verified by a new worker.
    replace_document(client, tp, tp.read_text().replace(ORIGINAL, MISSING), 2)
    await wait_for(lambda: {d.code for d in diagnostics_of(client, tp)} == {"missing-reduction"})
