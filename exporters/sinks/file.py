"""``file:///dir``: rotating NDJSON spool files per rank, the embedded default.

Files are ``dir/{job}/rank-{rank:05d}-{pid}-{seq:06d}.ndjson``: what ``argus diagnose dir``
reads. A file is closed and the next one opened past ``file_max_bytes``; past
``spool_max_bytes`` for this rank the oldest files are deleted and their records counted as
dropped (``spool_full``), so a job that runs for weeks cannot fill the disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from argus_exporters.config import ConfigError, Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A job name made safe as one path component (no separators, no '..')."""
    cleaned = _SAFE.sub("_", text).strip("._") or "job"
    return cleaned[:128]


class FileSink:
    """Appends lines to size-capped, rotating spool files."""

    def __init__(self, settings: Settings, identity: RankIdentity, health: Health):
        url = urlparse(settings.sink)
        if url.netloc not in ("", "localhost") or not url.path.startswith("/"):
            raise ConfigError(f"ARGUS_SINK={settings.sink!r}: file URLs are file:///absolute/dir")
        self.directory = Path(unquote(url.path)) / safe_name(identity.job)
        self.prefix = f"rank-{identity.rank:05d}-{os.getpid()}"
        self.max_file = settings.file_max_bytes
        self.max_total = settings.spool_max_bytes
        self.health = health
        self._handle = None
        self._seq = 0
        self._written = 0
        self._files: list[tuple[Path, int, int]] = []  # (path, bytes, records), oldest first

    def _open_next(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.prefix}-{self._seq:06d}.ndjson"
        self._seq += 1
        self._handle = open(path, "ab")  # noqa: SIM115 - kept open across exports
        self._files.append((path, 0, 0))
        self._written = 0

    def export(self, lines: list[bytes]) -> bool:
        """Append the lines; rotate and trim the spool as needed."""
        try:
            if self._handle is None or self._written >= self.max_file:
                self._open_next()
            data = b"".join(lines)
            self._handle.write(data)
            self._handle.flush()
            self._written += len(data)
            path, size, records = self._files[-1]
            self._files[-1] = (path, size + len(data), records + len(lines))
            self._trim()
            return True
        except OSError:
            self._handle = None  # reopen next time (disk full, directory removed...)
            return False

    def _trim(self) -> None:
        total = sum(size for _, size, _ in self._files)
        while total > self.max_total and len(self._files) > 1:
            path, size, records = self._files.pop(0)
            path.unlink(missing_ok=True)
            total -= size
            self.health.drop("spool_full", records)

    def force_flush(self, timeout: float) -> bool:
        """Flush the open file."""
        if self._handle is not None:
            self._handle.flush()
        return True

    def shutdown(self) -> None:
        """Close the open file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
