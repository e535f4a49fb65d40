"""``--listen HOST:PORT`` of the long-running commands (processor, scorer), parsed once."""

from __future__ import annotations

MAX_PORT = 65_535


def host_port(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT`` (``:PORT`` listens on ``default_host``); a
    ValueError naming the flag when the port is missing or past 65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdecimal() or int(port) > MAX_PORT:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, PORT from 0 to {MAX_PORT}")
    return host or default_host, int(port)
