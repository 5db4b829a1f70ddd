"""The worker keeps the reference captured block by block between edits while the reference's
files are unchanged, and never after one of them changed."""

from __future__ import annotations

import pytest
from lsp_helpers import open_document, replace_document, wait_for, workspace_fixture

pytestmark = pytest.mark.slow

# the example's tensor-parallel check (two layers: one template) at one world size, in full
PYPROJECT = """[tool.shardproof]
python-path = ["."]

[[tool.shardproof.check]]
name = "llama-tp"
reference = "llama_example.model:build"
parallel = "llama_example.tp:parallelize"
inputs = "llama_example.model:example_inputs"
world-sizes = [2]
outputs = "replicated"
"""
example = workspace_fixture("reference-reuse", None, {"debounceMs": 200}, extra={"pyproject.toml": PYPROJECT})


async def _verdict_after(client, path, text: str, version: int) -> str:
    before = len(client.verificationFinished)
    replace_document(client, path, text, version)
    await wait_for(lambda: len(client.verificationFinished) > before, client=client, timeout=300)
    return client.verificationFinished[-1]["verdict"]


async def test_an_edit_of_the_reference_is_verified_against_the_edited_reference(example) -> None:
    client = example
    model = client.root / "llama_example/model.py"
    parallel = client.root / "llama_example/tp.py"
    open_document(client, parallel)
    open_document(client, model)
    await wait_for(lambda: client.verificationFinished, client=client, timeout=300)
    assert client.verificationFinished[-1]["verdict"] == "verified"
    original = model.read_text()
    # the reference's attention output doubled: the parallel code no longer computes it
    doubled = original.replace("        return self.wo(out)\n", "        return self.wo(out) * 2\n", 1)
    assert doubled != original
    assert await _verdict_after(client, model, doubled, 2) != "verified"
    # an edit of the parallel code only, the reference (edited) kept: still not the same function
    assert await _verdict_after(client, parallel, parallel.read_text() + "\n# edited\n", 2) != "verified"
    assert await _verdict_after(client, model, original, 3) == "verified"
    assert await _verdict_after(client, parallel, parallel.read_text() + "\n# edited again\n", 3) == "verified"
