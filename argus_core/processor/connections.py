"""Connections the processor will hold: a cap, read timeouts, and who goes first when full.

A slow-loris client (a byte every 15 s) used to hold a connection for ever, and 20,000 of them
ran the process out of file descriptors. Now:

- request headers must be complete within ``idle_timeout_s`` of connecting or of the previous
  response (aiohttp's keep-alive timer, which closes a connection whose request has not
  arrived);
- a request body must keep coming: :func:`read_body` gives up after ``read_timeout_s`` without
  a byte (408, connection closed);
- at most ``max_connections`` are open: a new one beyond the cap evicts the connection that
  has made progress least recently and is not being served (a stalled reader, an idle
  keep-alive), so a burst of slow clients cannot lock out Vector or ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from aiohttp import ClientConnectionError, web

logger = logging.getLogger("argus_core.processor")

FD_RESERVE = 256
"""File descriptors kept free of connections: windows' files, the log, spool, S3 sockets."""


class BodyTimeoutError(Exception):
    """The client stopped sending its request body."""


class BodyTooLargeError(Exception):
    """The request body exceeds the limit."""


class BodyOverBudgetError(Exception):
    """The request body, read so far, does not fit in the memory budget."""


class ClientGoneError(Exception):
    """The client closed the connection (or was evicted) before its body arrived."""


class ConnectionGuard:
    """Tracks the server's connections: progress times, which are being served, the cap."""

    def __init__(self, max_connections: int):
        self.max_connections = effective_cap(max_connections)
        self.evicted = 0
        self.refused = 0
        self._progress: dict[Any, float] = {}  # handler -> monotonic time of last progress
        self._serving: set[Any] = set()
        self._server: Any = None

    def install(self, server: web.Server) -> None:
        """Wrap an aiohttp low-level server's connection hooks (after ``runner.setup()``)."""
        self._server = server
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            made(handler, transport)
            self._progress[handler] = time.monotonic()
            if len(self._progress) > self.max_connections:
                self._evict(newcomer=handler)

        def connection_lost(handler, exc=None):
            self._progress.pop(handler, None)
            self._serving.discard(handler)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._progress)

    def progress(self, handler: Any) -> None:
        """The connection made progress (a request arrived, body bytes came in)."""
        if handler in self._progress:
            self._progress[handler] = time.monotonic()

    @contextlib.contextmanager
    def serving(self, handler: Any):
        """The connection's request is being processed (never evicted meanwhile)."""
        self.progress(handler)
        self._serving.add(handler)
        try:
            yield
        finally:
            self._serving.discard(handler)
            self.progress(handler)

    def _evict(self, newcomer: Any) -> None:
        candidates = [(t, id(h), h) for h, t in self._progress.items()
                      if h is not newcomer and h not in self._serving]
        victim = min(candidates)[2] if candidates else newcomer
        if victim is newcomer:
            self.refused += 1
        else:
            self.evicted += 1
        self._progress.pop(victim, None)
        victim.force_close()
        transport = getattr(victim, "transport", None)
        if transport is not None:
            transport.close()


def effective_cap(requested: int) -> int:
    """The connection cap the file descriptor limit allows (raising the soft limit to the
    hard one first, as servers do)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        if soft != resource.RLIM_INFINITY and soft - FD_RESERVE < requested:
            allowed = max(16, soft - FD_RESERVE)
            logger.warning("argus processor: %d connections requested, the file descriptor "
                           "limit (%d) allows %d", requested, soft, allowed)
            return allowed
    return requested


async def read_body(request: web.Request, max_bytes: int, read_timeout_s: float,
                    guard: ConnectionGuard | None = None,
                    charge: Callable[[int], bool] | None = None) -> bytes:
    """The whole request body, waiting at most ``read_timeout_s`` for each piece.
    ``charge(size)`` is told the bytes read so far after each piece and answers whether they
    fit (chunked bodies are charged as they arrive, not after)."""
    length = request.content_length
    if length is not None and length > max_bytes:
        raise BodyTooLargeError(f"body of {length} bytes exceeds the limit of {max_bytes}")
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            piece = await asyncio.wait_for(request.content.readany(), read_timeout_s)
        except TimeoutError:
            raise BodyTimeoutError(f"no request body bytes for {read_timeout_s:g} s") from None
        except (ConnectionError, ClientConnectionError) as exc:
            raise ClientGoneError(str(exc) or type(exc).__name__) from None
        if not piece:
            break
        size += len(piece)
        if size > max_bytes:
            raise BodyTooLargeError(f"body exceeds the limit of {max_bytes} bytes")
        pieces.append(piece)
        if charge is not None and not charge(size):
            raise BodyOverBudgetError(f"the memory budget is full ({size} bytes of this body "
                                      f"read)")
        if guard is not None:
            guard.progress(request.protocol)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
