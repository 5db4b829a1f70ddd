"""Squiggles where the fix belongs, cleared when the code is fixed."""

from __future__ import annotations

import pytest
from lsp_helpers import diagnostics_of, open_document, replace_document, wait_for, workspace_fixture
from lsprotocol import types

pytestmark = pytest.mark.slow

missing = workspace_fixture("missing", "missing-all-reduce", extra={"scripts/plot.py": "import math\nprint(math.pi)\n"})
slow_worker = workspace_fixture("timeout", None, options={"workerTimeoutSeconds": 0.5})
nothing_declared = workspace_fixture("undeclared", None, extra={"pyproject.toml": "[project]\nname = 'x'\n"})


async def test_buggy_file_gets_a_diagnostic_at_the_mistake_and_loses_it_when_fixed(missing) -> None:
    import bug_variants

    client = missing
    root = client.root
    bug = bug_variants.variant("missing-all-reduce")
    tp = root / bug.file
    line = bug.line_number(root)
    open_document(client, tp)
    found = await wait_for(lambda: [d for d in diagnostics_of(client, tp) if d.code == "missing-reduction"])
    (d,) = found
    assert d.source == "shardproof"
    assert d.severity == types.DiagnosticSeverity.Error
    assert d.range.start.line == line - 1
    text_line = tp.read_text().splitlines()[line - 1]
    assert text_line[d.range.start.character : d.range.end.character] == "F.linear(x, self.weight)"
    assert d.code_description is not None and d.code_description.href.endswith("#discrepancy-kinds-missing-reduction")
    assert d.data["discrepancyId"] and d.data["check"] == "llama-tp-missing-all-reduce"
    related = d.related_information or []
    assert any(r.location.uri.endswith("llama_example/model.py") for r in related)
    # model.py takes part in the check: it gets (empty) diagnostics although it is not open;
    # a file that takes no part gets none at all.
    assert (root / "llama_example/model.py").as_uri() in client.diagnostics
    assert (root / "scripts/plot.py").as_uri() not in client.diagnostics

    fixed = tp.read_text().replace(bug.buggy, bug.original)
    replace_document(client, tp, fixed, 2)
    await wait_for(lambda: tp.as_uri() in client.diagnostics and not diagnostics_of(client, tp))


async def test_a_verification_past_the_worker_timeout_is_stopped_and_reported(slow_worker) -> None:
    client = slow_worker
    pyproject = client.root / "pyproject.toml"
    found = await wait_for(
        lambda: [d for d in diagnostics_of(client, pyproject) if d.code == "worker-failed"], client=client
    )
    assert "longer than 0.5 s" in found[0].message
    assert any("shardproof" in m.message and "restarted" in m.message for m in client.messages)


async def test_a_workspace_without_a_declaration_says_so(nothing_declared) -> None:
    client = nothing_declared
    await wait_for(lambda: any("no pyproject.toml with a [tool.shardproof]" in m.message for m in client.messages))
    assert not client.diagnostics
