"""What the editor verifies: each check's full declaration by default, its quick table when the
editorConfiguration setting asks for it; the running verification's progress; results that say
which configuration they are from."""

from __future__ import annotations

import pytest
from lsp_helpers import diagnostics_of, open_document, plain, replace_document, tiny_fixture, wait_for
from lsprotocol import types

pytestmark = pytest.mark.slow

QUICK = "\n[tool.shardproof.check.quick]\nworld-sizes = [2]\n"
# a check at world sizes 2 and 4 with a quick table verifying 2 only
declared = tiny_fixture("editor-configuration", ["ok"], extra={"pyproject.toml": QUICK})
REDUCTION = "        dist.all_reduce(y)\n"


def _runs(client) -> list[tuple[str, dict]]:
    return [
        (m, p)
        for m, p in client.shardproof_notifications
        if m in ("verificationStarted", "progress", "verificationFinished")
    ]


def _last_run(client, since: int) -> tuple[dict, list[dict], dict] | None:
    """The last verification that started and finished after notification `since`: its start,
    its progress events and its end."""
    runs = _runs(client)[since:]
    ends = [i for i, (m, _) in enumerate(runs) if m == "verificationFinished"]
    if not ends:
        return None
    end = ends[-1]
    start = max(i for i, (m, _) in enumerate(runs[:end]) if m == "verificationStarted")
    return runs[start][1], [p for m, p in runs[start + 1 : end] if m == "progress"], runs[end][1]


async def _edited_run(client, parallel, text: str, version: int) -> tuple[dict, list[dict], dict]:
    since = len(_runs(client))
    replace_document(client, parallel, text, version)
    return await wait_for(lambda: _last_run(client, since), client=client)


async def test_edits_verify_the_full_declaration_by_default_and_the_quick_table_when_set(declared) -> None:
    client = declared
    parallel = client.root / "tinymlp/parallel.py"
    open_document(client, parallel)
    await wait_for(lambda: client.verificationFinished, client=client)
    assert client.verificationFinished[-1]["mode"] == "full"  # the cold run, on opening
    original = parallel.read_text()
    missing = original.replace(REDUCTION, "", 1)

    # an edit: the full declaration (world sizes 2 and 4), its progress reported while it runs
    started, progress, finished = await _edited_run(client, parallel, missing, 2)
    assert started["mode"] == "full" and started["worldSizes"] == [2, 4]
    assert finished["mode"] == "full" and finished["verdict"] == "discrepancy"
    assert [w["worldSize"] for w in finished["worldSizes"]] == [2, 4]
    assert finished["discrepancies"] == 1  # one finding (one squiggle) at both world sizes, counted once
    assert progress and all(p["check"] == "ok" and p["mode"] == "full" for p in progress)
    stages = {(p["world_size"], p["stage"]) for p in progress}
    assert {(2, "capture"), (4, "capture"), (4, "verification")} <= stages, stages
    (diagnostic,) = await wait_for(lambda: diagnostics_of(client, parallel), client=client)
    assert "(ok, world sizes 2, 4)" in diagnostic.message
    assert diagnostic.data["mode"] == "full" and diagnostic.data["configuration"] == "full declaration"

    # the setting: the check is verified again at once in its quick configuration, and so on edits
    since = len(_runs(client))
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"shardproof": {"editorConfiguration": "quick"}})
    )
    started, progress, finished = await wait_for(lambda: _last_run(client, since), client=client)
    assert started["mode"] == "quick" and started["worldSizes"] == [2]
    assert [w["worldSize"] for w in finished["worldSizes"]] == [2] and finished["mode"] == "quick"
    # world size 0: the reference, captured once per check
    assert {p["world_size"] for p in progress} <= {0, 2} and all(p["mode"] == "quick" for p in progress)
    (diagnostic,) = await wait_for(
        lambda: [d for d in diagnostics_of(client, parallel) if d.data and d.data.get("mode") == "quick"]
    )
    assert "(ok, quick configuration: world size 2)" in diagnostic.message
    started, _, finished = await _edited_run(client, parallel, missing + "\n# edited\n", 3)
    assert started["mode"] == finished["mode"] == "quick"

    # a bad value keeps the quick configuration and says so
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"shardproof": {"editorConfiguration": "everything"}})
    )
    started, _, finished = await _edited_run(client, parallel, original, 4)
    assert started["mode"] == finished["mode"] == "quick" and finished["verdict"] == "verified"
    assert any("editorConfiguration must be one of full, quick" in m.message for m in client.messages)

    # Verify Full Model verifies the full declaration whatever the setting
    summary = plain(
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.verifyFullModel", arguments=[])
        )
    )
    (check,) = summary["checks"]
    assert check["mode"] == "full" and [w["worldSize"] for w in check["worldSizes"]] == [2, 4]
