"""The HTTP/1.1 connection of ``tempering serve``: uvicorn's h11 protocol with read timeouts.

uvicorn (0.54) times out only an idle keep-alive connection, after a response: a client that
opens a connection and sends half its headers, or half its body, and then stalls holds the
connection (and, mid-body, the request's handler) for ever. :class:`TimedH11Protocol` closes
such a connection after ``read_timeout`` seconds (``tempering serve --read-timeout``):

- **headers**: all of a request's headers must arrive within ``read_timeout`` of its first byte
  (of the connection's opening, for its first request), so a client that trickles a byte at a
  time cannot hold the connection either;
- **body**: an incomplete body gets ``read_timeout`` seconds after each chunk, so a large upload
  on a slow link takes as long as it keeps sending. While the server itself has stopped reading
  (the handler has not taken the buffered data yet: uvicorn's flow control) the clock waits.

A request whose response has not started is answered ``408`` with a JSON ``detail`` before the
connection closes; a handler waiting for the body sees a disconnect. Each case is logged at INFO
(a stalled client is the client's problem, not the server's). Other connections are served
meanwhile: everything here runs on the event loop, without blocking it.

The server pins this protocol (uvicorn's ``auto`` would pick httptools where it is installed,
and these timeouts would not apply).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Literal

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEFAULT_READ_TIMEOUT_S", "TimedH11Protocol", "timed_protocol"]

log = logging.getLogger("tempering.serve")

DEFAULT_READ_TIMEOUT_S = 30.0
"""How long a request's headers may take, and how long its body may pause between chunks."""

_Waiting = Literal["headers", "body"]


class TimedH11Protocol(H11Protocol):
    """uvicorn's ``H11Protocol`` with read timeouts for headers and bodies (module docstring).

    Use :func:`timed_protocol` for a class with another timeout.
    """

    read_timeout: float = DEFAULT_READ_TIMEOUT_S

    _deadline: asyncio.TimerHandle | None = None
    _waiting: _Waiting | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._follow()

    def _follow(self) -> None:
        """Arm, restart or stop the clock for what the connection now waits for."""
        if self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body")  # a new chunk restarts the body's clock
        elif state is h11.IDLE:
            # the next request's first bytes start its headers' clock, which never restarts; a
            # connection idle between requests is uvicorn's keep-alive timeout's business
            if not self.conn.trailing_data[0]:
                self._disarm()
            elif self._waiting != "headers":
                self._arm("headers")
        else:  # the request is in (the handler runs, or a long poll waits), or the connection ends
            self._disarm()

    def _arm(self, waiting: _Waiting) -> None:
        self._disarm()
        self._waiting = waiting
        self._deadline = self.loop.call_later(self.read_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._waiting = None

    def _expired(self) -> None:
        waiting = self._waiting
        self._deadline = None
        self._waiting = None
        if waiting is None or self.transport.is_closing():
            return
        if waiting == "body" and self.flow.read_paused:  # we stopped reading, not the client
            self._arm("body")
            return
        cycle = self.cycle if waiting == "body" else None
        client = "%s:%d" % self.client if self.client else "a client"  # noqa: UP031 (uvicorn's own form)
        what = (
            "request headers"
            if cycle is None
            else f"request body of {self.scope['method']} {self.scope['path']}"
        )
        log.info(
            "%s: %s incomplete after %g s (--read-timeout): connection closed",
            client,
            what,
            self.read_timeout,
        )
        if cycle is None or not cycle.response_started:
            detail = f"{what} incomplete after {self.read_timeout:g} s (the server's --read-timeout)"
            body = json.dumps({"detail": detail}).encode()
            head = (
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the handler's next receive() is a disconnect; its answer is dropped
            cycle.message_event.set()
        self.transport.close()


def timed_protocol(read_timeout: float) -> type[TimedH11Protocol]:
    """A :class:`TimedH11Protocol` class with ``read_timeout`` seconds (for ``uvicorn.Config(http=...)``)."""
    if not read_timeout > 0 or read_timeout == float("inf"):
        raise ValueError(f"read_timeout must be a positive number of seconds, got {read_timeout}")

    class Protocol(TimedH11Protocol):
        pass

    Protocol.read_timeout = read_timeout
    return Protocol
