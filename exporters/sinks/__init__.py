"""Where shipped records go. A sink is three methods, as in OpenTelemetry's exporters:
``export(lines) -> bool``, ``force_flush(timeout) -> bool`` and ``shutdown()``; it never raises
into its caller. A sink that waits to retry may add ``stop_waiting()``, which the shipper calls
when its shutdown timeout runs out. Sinks are chosen by URL scheme through the
``argus_exporters.sinks`` entry points, so a new destination is a new class, not an edit here."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol
from urllib.parse import urlparse

from argus_exporters.config import ConfigError, Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity


class Sink(Protocol):
    """Destination of NDJSON lines."""

    def export(self, lines: list[bytes]) -> bool:
        """Write or send the lines; False when they could not be delivered."""

    def force_flush(self, timeout: float) -> bool:
        """Push anything buffered; True when done within ``timeout`` seconds."""

    def shutdown(self) -> None:
        """Release files and connections."""


_BUILTIN = {"file": "argus_exporters.sinks.file:FileSink",
            "http": "argus_exporters.sinks.http:HttpSink",
            "https": "argus_exporters.sinks.http:HttpSink"}


def create_sink(settings: Settings, identity: RankIdentity, health: Health) -> Sink:
    """The sink for ``settings.sink`` (``file:///dir`` or ``http(s)://host:port/path``)."""
    scheme = urlparse(settings.sink).scheme
    found = {ep.name: ep for ep in entry_points(group="argus_exporters.sinks")}
    if scheme in found:
        factory = found[scheme].load()
    elif scheme in _BUILTIN:
        module, _, name = _BUILTIN[scheme].partition(":")
        factory = getattr(__import__(module, fromlist=[name]), name)
    else:
        raise ConfigError(f"ARGUS_SINK={settings.sink!r}: unknown scheme {scheme!r} "
                          f"(known: {', '.join(sorted(set(_BUILTIN) | set(found)))})")
    return factory(settings, identity, health)
