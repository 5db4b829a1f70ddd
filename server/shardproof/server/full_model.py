"""Verify Full Model: every check at every declared world size in its full declaration, with
cancellable progress, whatever the editor verifies on edits; a check an edit interrupts is
verified again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any

from lsprotocol import types

if TYPE_CHECKING:
    from .server import ShardproofLanguageServer

log = logging.getLogger("shardproof.server")

# How often Verify Full Model runs a check again after an edit cancelled its run.
FULL_MODEL_RETRIES = 1


async def verify_full_model(server: ShardproofLanguageServer, client_token: str | None = None) -> dict[str, Any]:
    """Every check at every declared world size, full configuration, with cancellable progress.

    The client may pass its own progress token (it then shows the progress itself); otherwise
    the server creates one with `window/workDoneProgress/create`.
    """
    token = client_token or str(uuid.uuid4())
    progress = server.work_done_progress
    if client_token is None:
        with contextlib.suppress(Exception):
            await progress.create_async(token)
    checks = [(s, c) for s in server.projects for c in (s.project.checks if s.project else [])]
    units = {(str(s.pyproject), c.name): 1 + 4 * len(c.world_sizes) for s, c in checks}
    total = max(sum(units.values()), 1)
    finished = 0
    progress.begin(
        token,
        types.WorkDoneProgressBegin(
            title="shardproof: Verify Full Model",
            cancellable=True,
            percentage=0,
            message=f"{len(checks)} check{'' if len(checks) == 1 else 's'}",
        ),
    )
    summary: list[dict[str, Any]] = []
    cancelled = False
    server.full_model_running = True
    try:
        for state, check in checks:
            if _cancelled(progress, token):
                cancelled = True
                break
            key = (str(state.pyproject), check.name)

            def on_progress(event: dict[str, Any], base: int = finished, check_name: str = check.name) -> None:
                if _cancelled(progress, token):
                    server.spawn(server.worker.cancel())
                    return
                done = base + int(event.get("done", 0))
                where = f", world size {event['world_size']}" if event.get("world_size") else ""
                progress.report(
                    token,
                    types.WorkDoneProgressReport(
                        message=f"{check_name}{where}: {event.get('stage', '')}",
                        percentage=min(99, int(100 * done / total)),
                    ),
                )

            result = None
            for _attempt in range(1 + FULL_MODEL_RETRIES):
                while server.running is not None:
                    await asyncio.sleep(0.05)
                pending = server.pending.pop(key, None)
                if pending is not None:
                    pending.cancel()
                state.failures.pop(check.name, None)
                result = await server.verify(state, check.name, "full", None, None, on_progress)
                if result is not None or _cancelled(progress, token) or check.name in state.failures:
                    break
                # an edit to a file of the check cancelled the run: verify it again once the
                # edit's own verification (in the editor's configuration) is done
                log.info("the full verification of %s was interrupted by an edit; running it again", check.name)
            finished += units[key]
            if result is None:
                if _cancelled(progress, token):
                    cancelled = True
                    break
                failure = state.failures.get(check.name)
                summary.append(
                    {
                        "check": check.name,
                        "verdict": "error" if failure else "interrupted",
                        "error": failure
                        or f"interrupted by edits {1 + FULL_MODEL_RETRIES} times; run Verify Full Model again",
                    }
                )
                continue
            summary.append(server.summary_of(result, "full"))
    finally:
        server.full_model_running = False
        message = "cancelled" if cancelled else "done"
        progress.end(token, types.WorkDoneProgressEnd(message=message))
    verdicts = [s["verdict"] for s in summary]
    return {
        "cancelled": cancelled,
        "checks": summary,
        "verified": verdicts.count("verified"),
        "discrepancy": verdicts.count("discrepancy"),
        "unproven": verdicts.count("unproven"),
        "inconclusive": verdicts.count("inconclusive"),
        "interrupted": verdicts.count("interrupted"),
        "error": verdicts.count("error"),
    }


def _cancelled(progress: Any, token: str) -> bool:
    future = progress.tokens.get(token)
    return bool(future is not None and future.cancelled())
