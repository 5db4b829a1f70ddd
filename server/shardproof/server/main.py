"""Start the server: logging to stderr with levels, a watchdog on the client process, stdio."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time


def _watch_parent(server: object) -> None:
    """Exit when the editor that started us is gone (it may die without closing stdin)."""

    def loop() -> None:
        while True:
            time.sleep(3)
            pid = getattr(server, "process_id", None)
            if pid:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    os._exit(0)
                except PermissionError:
                    pass

    threading.Thread(target=loop, daemon=True, name="parent-watchdog").start()


def main() -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("SHARDPROOF_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pygls").setLevel(logging.WARNING)  # pygls logs every message at INFO
    from . import create_server

    server = create_server()
    _watch_parent(server)
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    server.start_io()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
