"""``http(s)://host:port/path``: gzip NDJSON POSTs to Vector's ``http_server`` source or the
processor. One attempt per batch within ``http_timeout_s``: a dead endpoint costs the shipper
thread a timeout, never the training thread, and the batch is counted as dropped."""

from __future__ import annotations

import gzip
import http.client
import os
from urllib.parse import urlparse

from argus_exporters.config import ConfigError, Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity


class HttpSink:
    """POSTs batches as ``application/x-ndjson`` with ``Content-Encoding: gzip``."""

    def __init__(self, settings: Settings, identity: RankIdentity, health: Health):
        url = urlparse(settings.sink)
        if not url.hostname:
            raise ConfigError(f"ARGUS_SINK={settings.sink!r}: missing host")
        self.https = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self.timeout = settings.http_timeout_s
        self.headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip",
                        "User-Agent": "argus-exporters/0.1"}
        token = os.environ.get("ARGUS_SINK_TOKEN")
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def export(self, lines: list[bytes]) -> bool:
        """Send one batch; True on a 2xx answer."""
        body = gzip.compress(b"".join(lines), compresslevel=1)
        try:
            conn = self._connection()
            conn.request("POST", self.path, body=body, headers=self.headers)
            response = conn.getresponse()
            response.read()
            return 200 <= response.status < 300
        except (OSError, http.client.HTTPException):
            self.shutdown()  # a fresh connection next time
            return False

    def force_flush(self, timeout: float) -> bool:
        """Nothing is buffered here."""
        return True

    def shutdown(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
