"""Server logs into the editor's log channel, with their levels.

Before the client is initialized, records go to stderr. Afterwards they travel as
`window/logMessage`, so that the editor files them under error / warning / info / debug instead of
treating every stderr line as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from lsprotocol import types

_LEVELS = (
    (logging.ERROR, types.MessageType.Error),
    (logging.WARNING, types.MessageType.Warning),
    (logging.INFO, types.MessageType.Info),
)


def _message_type(levelno: int) -> types.MessageType:
    for threshold, message_type in _LEVELS:
        if levelno >= threshold:
            return message_type
    return types.MessageType.Debug


class ClientLogHandler(logging.Handler):
    def __init__(self, server: object, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.server = server
        self.loop = loop
        self.client_unreachable = False
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("pygls.protocol") and record.levelno >= logging.ERROR:
            # pygls could not talk to the client (it went away, the pipe broke). Sending this record
            # would fail the same way and log again, forever: from now on, logs go to stderr.
            self.client_unreachable = True
        if self.client_unreachable:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(self.format(record) + "\n")
            return
        try:
            params = types.LogMessageParams(type=_message_type(record.levelno), message=self.format(record))
            # Records may come from helper threads; the transport belongs to the event loop.
            self.loop.call_soon_threadsafe(self.server.window_log_message, params)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - logging must never take the server down
            self.handleError(record)


def log_to_client(server: object) -> None:
    """Route the root logger's records to the client from now on (call from a handler on the loop)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, ClientLogHandler):
            return
        if getattr(handler, "stream", None) is sys.stderr:
            root.removeHandler(handler)
    root.addHandler(ClientLogHandler(server, asyncio.get_running_loop()))
