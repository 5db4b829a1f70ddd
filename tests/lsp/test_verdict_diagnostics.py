"""Verdicts in the editor: a shown discrepancy is an Error, an unproven finding a Warning that says
what the numbers found; both explained, counted in the summaries."""

from __future__ import annotations

import pytest
from lsp_helpers import diagnostics_of, open_document, plain, tiny_fixture, wait_for
from lsprotocol import types

pytestmark = pytest.mark.slow

verdicts = tiny_fixture("verdicts", ["gathered-sum", "unmasked-embedding"])


async def test_an_unproven_finding_is_a_warning_with_the_witness_and_a_discrepancy_an_error(verdicts) -> None:
    client = verdicts
    parallel = client.root / "tinymlp/parallel.py"
    open_document(client, parallel)
    found = await wait_for(
        lambda: (
            {d.code: d for d in diagnostics_of(client, parallel)} if len(client.verificationFinished) >= 2 else None
        ),
        client=client,
    )
    unproven, discrepancy = found["unproven"], found["not-equivalent"]
    assert unproven.severity == types.DiagnosticSeverity.Warning
    assert "witness: no difference found: the outputs agree" in unproven.message
    assert "suspected (partial-sum-into-nonlinear, not shown)" in unproven.message
    assert unproven.data["kind"] == "unproven" and unproven.data["suspected"] == "partial-sum-into-nonlinear"
    assert unproven.code_description.href.endswith("#verdicts")
    assert discrepancy.severity == types.DiagnosticSeverity.Error
    assert "witness: confirmed numerically" in discrepancy.message
    # related information: each location once, never the squiggle's own line
    for d in (unproven, discrepancy):
        places = [(r.location.uri, r.location.range.start.line) for r in d.related_information or []]
        assert len(places) == len(set(places)), places
        assert (parallel.as_uri(), d.range.start.line) not in places
    finished = {e["check"]: e for e in client.verificationFinished}
    assert finished["gathered-sum"]["verdict"] == "unproven" and finished["gathered-sum"]["unproven"] == 1
    assert finished["unmasked-embedding"]["verdict"] == "discrepancy"
    explanation = plain(
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.explainDiscrepancy", arguments=[unproven.data])
        )
    )
    assert explanation["verdict"] == "unproven" and explanation["kind"] == "unproven"
    markdown = explanation["markdown"]
    assert markdown.startswith("## unproven") and "Not a shown difference" in markdown
    assert "| seed | inputs | dtype | largest relative error |" in markdown
    summary = plain(
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="shardproof.server.verifyFullModel", arguments=[])
        )
    )
    assert (summary["unproven"], summary["discrepancy"], summary["verified"]) == (1, 1, 0)
