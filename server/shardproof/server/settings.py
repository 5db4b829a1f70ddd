"""Server settings, from `initializationOptions` or `workspace/didChangeConfiguration` (camelCase on
the wire, snake_case here). Bad values fall back to the defaults with a warning."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("shardproof.server")

RUN_MODES = ("onType", "onSave")
# What the editor verifies of each check (on opening the workspace, on edits, on saves): its full
# declaration, or its reduced `[tool.shardproof.check.quick]` table when it declares one.
EDITOR_CONFIGURATIONS = ("full", "quick")


@dataclass(frozen=True)
class Settings:
    run: str = "onType"  # re-verify on every edit (debounced) or only on save
    debounce_ms: int = 600
    # a verification running longer is stopped (the user is told where it was after 10 s already)
    worker_timeout_seconds: float = 120.0
    log_level: str = "info"
    editor_configuration: str = "full"

    @staticmethod
    def from_options(options: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
        """Settings from client options; returns the settings and the problems found."""
        base = base or Settings()
        if not isinstance(options, dict):
            return base, []
        if isinstance(options.get("shardproof"), dict):
            options = options["shardproof"]
        problems: list[str] = []
        changes: dict[str, Any] = {}
        run = options.get("run")
        if run is not None:
            if run in RUN_MODES:
                changes["run"] = run
            else:
                problems.append(f"shardproof.run must be one of {', '.join(RUN_MODES)}, got {run!r}")
        configuration = options.get("editorConfiguration")
        if configuration is not None:
            if configuration in EDITOR_CONFIGURATIONS:
                changes["editor_configuration"] = configuration
            else:
                problems.append(
                    f"shardproof.editorConfiguration must be one of {', '.join(EDITOR_CONFIGURATIONS)}, "
                    f"got {configuration!r}"
                )
        for key, field_name, cast in (
            ("debounceMs", "debounce_ms", int),
            ("workerTimeoutSeconds", "worker_timeout_seconds", float),
        ):
            value = options.get(key)
            if value is None:
                continue
            try:
                number = cast(value)
                if number < 0:
                    raise ValueError
                changes[field_name] = number
            except (TypeError, ValueError):
                problems.append(f"shardproof.{key} must be a non-negative number, got {value!r}")
        level = options.get("logLevel")
        if level is not None:
            if str(level).lower() in ("error", "warning", "info", "debug", "trace", "off"):
                changes["log_level"] = str(level).lower()
            else:
                problems.append(f"shardproof.logLevel must be error, warning, info, debug or off, got {level!r}")
        return dataclasses.replace(base, **changes), problems
