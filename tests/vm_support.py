"""A victoria-metrics single node for tests, fed samples through its import API."""

from __future__ import annotations

import contextlib
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from support import free_port

from argus_core.stack.processes import start, wait_ready


@contextlib.contextmanager
def victoria_metrics(workdir: Path) -> Iterator[str]:
    """victoria-metrics on a free loopback port, its URL yielded; skipped where it is not
    installed. Imported samples stay the latest however long a test takes to read them."""
    binary = shutil.which("victoria-metrics")
    if binary is None:
        pytest.skip("victoria-metrics is not installed (apt-get install victoria-metrics)")
    url = f"http://127.0.0.1:{free_port()}"
    process = start("victoria-metrics", [
        binary, f"-httpListenAddr={url[7:]}", f"-storageDataPath={workdir / 'data'}",
        "-retentionPeriod=1d", "-search.latencyOffset=1s", "-search.maxStalenessInterval=1h"],
        workdir / "logs")
    try:
        wait_ready(process, url + "/health", timeout=120)
        yield url
    finally:
        process.stop(60)


def import_series(url: str, lines: list[dict]) -> None:
    """Write ``/api/v1/import`` JSON lines (``metric``, ``values``, ``timestamps`` in ms) and
    flush them to the searchable store."""
    body = b"\n".join(map(orjson.dumps, lines)) + b"\n"
    with urllib.request.urlopen(urllib.request.Request(url + "/api/v1/import", data=body),
                                timeout=60) as answer:
        answer.read()
    with urllib.request.urlopen(url + "/internal/force_flush", timeout=60) as answer:
        answer.read()
