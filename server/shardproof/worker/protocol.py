"""Messages between the language server and its worker: one JSON object per line.

server -> worker
  {"id": 7, "method": "verify", "params": {"pyproject": path, "check": name, "mode": "quick"|"full",
                                            "world_sizes": [2] | null, "overlay": {path: text}}}
  {"id": 7, "method": "cancel"}
  {"method": "shutdown"}

worker -> server
  {"event": "ready", "pid": 1234, "python": "3.11.7", "versions": {...}}
  {"id": 7, "event": "progress", "world_size": 2, "stage": "capture", "done": 1, "total": 3}
  {"id": 7, "event": "result", "result": CheckResult.to_dict(), "dependencies": [paths]}
  {"id": 7, "event": "cancelled"}
  {"id": 7, "event": "failed", "message": text}

Only the standard library is used here: the server imports this module, never torch.
"""

from __future__ import annotations

import json
from typing import Any


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":")) + "\n"


def decode(line: str) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a protocol message must be a JSON object")
    return message
