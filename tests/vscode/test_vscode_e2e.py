"""The extension in real VS Code (code-server + chromium, headless and offline).

Builds the extension exactly as a user gets it (`npm run package` -> shardproof.vsix), installs it
into a fresh code-server profile and drives the browser through two scenarios:
- editing (e2e.js): squiggle, hover, Problems, "Explain discrepancy", typing the fix, "Verify Full
  Model";
- lifecycle (lifecycle.js): workspace trust, an interpreter without shardproof, choosing another,
  settings, single-flight restarts, a server crash.
Screenshots of every step land in tests/vscode/artifacts/. SHARDPROOF_E2E_CYCLES=5 repeats each.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vscode]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARTIFACTS = HERE / "artifacts"


def _run(command: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vsix() -> Path:
    for tool in ("node", "npm", "bash"):
        if shutil.which(tool) is None:
            pytest.fail(f"the VS Code end-to-end test needs {tool} on PATH (see the README's test command)")
    setup = _run(["bash", str(HERE / "setup.sh")], timeout=1200)
    assert setup.returncode == 0, f"tests/vscode/setup.sh failed:\n{setup.stdout}\n{setup.stderr}"
    if not (ROOT / "node_modules" / ".bin" / "vsce").exists():
        install = _run(["npm", "ci", "--no-audit", "--no-fund"], timeout=900)
        assert install.returncode == 0, f"npm ci failed:\n{install.stdout}\n{install.stderr}"
    package = _run(["npm", "run", "package"], timeout=600)
    assert package.returncode == 0, f"npm run package failed:\n{package.stdout}\n{package.stderr}"
    built = ROOT / "shardproof.vsix"
    assert built.is_file()
    return built


@pytest.mark.parametrize("scenario", ["editing", "lifecycle"])
def test_scenario_passes_in_real_vscode(vsix: Path, scenario: str) -> None:
    cycles = int(os.environ.get("SHARDPROOF_E2E_CYCLES", "1"))
    for cycle in range(1, cycles + 1):
        shots = ARTIFACTS / scenario / f"cycle-{cycle}"
        shutil.rmtree(shots, ignore_errors=True)
        run = _run(
            ["bash", str(HERE / "run_e2e.sh"), str(vsix), sys.executable, str(shots), str(_free_port()), scenario],
            timeout=600,
        )
        (shots / "scenario.log").write_text(run.stdout + "\n--- stderr ---\n" + run.stderr)
        report = run.stdout.strip().splitlines()
        summary = next((line for line in reversed(report) if " passed, " in line), "no summary")
        assert run.returncode == 0 and summary.endswith(" 0 failed"), (
            f"cycle {cycle}: {summary}\n{run.stdout}\n{run.stderr[-4000:]}\n(screenshots in {shots})"
        )
        steps = [line for line in report if line.startswith("ok ")]
        expected_steps = {"editing": 12, "lifecycle": 6}[scenario]
        assert len(steps) == expected_steps, f"cycle {cycle}: {len(steps)} of {expected_steps} steps ran"
