"""Small helpers shared by the tests (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
