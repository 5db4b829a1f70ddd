"""Server logs reach the client, and a client that has gone away does not make the server spin."""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types
from pygls.exceptions import JsonRpcInternalError

from shardproof.server.client_log import ClientLogHandler
from shardproof.server.server import ShardproofLanguageServer


class GoneClient:
    """A server whose every send fails the way pygls reports a closed pipe: by logging an error."""

    def __init__(self) -> None:
        self.sends = 0

    def window_log_message(self, params: types.LogMessageParams) -> None:
        self.sends += 1
        logging.getLogger("pygls.protocol.json_rpc").error("Error sending data")


def test_a_client_that_went_away_gets_no_more_sends_and_logs_go_to_stderr(capsys) -> None:
    loop = asyncio.new_event_loop()
    server = GoneClient()
    handler = ClientLogHandler(server, loop)
    logger = logging.getLogger("shardproof.test_client_log")
    logger.addHandler(handler)
    logging.getLogger("pygls.protocol.json_rpc").addHandler(handler)
    try:
        logger.warning("worker restarted")
        for _ in range(20):  # run whatever the sends schedule
            loop.call_soon(loop.stop)
            loop.run_forever()
        assert server.sends == 1  # the first failure stops the forwarding, no loop
        assert handler.client_unreachable
        logger.warning("after the client left")
        assert "after the client left" in capsys.readouterr().err
    finally:
        logger.removeHandler(handler)
        logging.getLogger("pygls.protocol.json_rpc").removeHandler(handler)
        loop.close()


def test_a_failed_send_is_not_reported_by_sending(caplog) -> None:
    server = ShardproofLanguageServer()
    shown: list[types.ShowMessageParams] = []
    server.window_show_message = shown.append  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        server.report_server_error(BrokenPipeError("pipe closed"), JsonRpcInternalError)
    assert not shown
    assert "cannot send to the client" in caplog.text
    server.report_server_error(ValueError("bad params"), JsonRpcInternalError.__mro__[1])
    assert len(shown) == 1  # other errors are still shown to the user
