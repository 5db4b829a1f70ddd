"""Verify Full Model while the user edits: an interrupted check is verified again, not reported as
an error."""

from __future__ import annotations

import asyncio

import pytest
from lsp_helpers import open_document, plain, replace_document, wait_for, workspace_fixture
from lsprotocol import types

pytestmark = pytest.mark.slow

# the edit's own verification in the quick configuration: the retry, not the edit, is under test
example = workspace_fixture("full-model-edit", None, {"debounceMs": 200, "editorConfiguration": "quick"})


async def test_a_check_interrupted_by_an_edit_is_verified_again(example) -> None:
    client = example
    tp = client.root / "llama_example/tp.py"
    open_document(client, tp)
    task = asyncio.ensure_future(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.verifyFullModel", arguments=[])
        )
    )

    def verifying_tp() -> bool:
        reports = [r for rs in client.progress_reports.values() for r in rs]
        return any(
            isinstance(r, types.WorkDoneProgressReport) and "llama-tp, world size" in (r.message or "") for r in reports
        )

    await wait_for(verifying_tp)
    replace_document(client, tp, tp.read_text() + "\n", 2)  # the edit cancels the running full verification
    result = plain(await asyncio.wait_for(task, timeout=600))
    verdicts = {c["check"]: c["verdict"] for c in result["checks"]}
    assert verdicts == {"llama-tp": "verified", "llama-sp": "verified"}, result
    assert result["error"] == 0 and result["interrupted"] == 0
