"""A real Prometheus for the tests (Debian's binary, our config, a free loopback port), and a
prometheus-client endpoint serving whatever collectors a test gives it."""

from __future__ import annotations

import json
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path

from promtools import binary
from support import free_port

from argus_core.rules.generate import to_yaml
from argus_core.stack.processes import start, wait_ready


class Prometheus:
    """``prometheus`` scraping ``targets`` (job name -> host:port) every ``interval``."""

    def __init__(self, workdir: Path, targets: dict[str, str], interval: str = "1s",
                 rule_files: list[str] | None = None):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "rule_files": rule_files or [],
                  "scrape_configs": [{"job_name": job, "honor_labels": True,
                                      "static_configs": [{"targets": [target]}]}
                                     for job, target in targets.items()]}
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(to_yaml(config))
        self.process = None

    def start(self) -> Prometheus:
        """Start (again, on the same port and data) and wait until ready."""
        self.process = start("prometheus", [
            binary("prometheus"), f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}"], self.workdir / "logs")
        wait_ready(self.process, self.url + "/-/ready", timeout=60)
        return self

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL)."""
        if self.process is not None:
            self.process.signal(signal.SIGCONT)
            self.process.stop()

    def pause(self) -> None:
        """Freeze it (SIGSTOP): connections are accepted, nothing is answered."""
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw it (SIGCONT)."""
        self.process.signal(signal.SIGCONT)

    def query(self, expr: str) -> list[dict]:
        """An instant query's result list."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"]

    def wait_for(self, expr: str, count: int = 1, timeout: float = 60.0) -> list[dict]:
        """Poll until ``expr`` returns at least ``count`` series."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if len(result) >= count:
                return result
            time.sleep(0.25)
        raise AssertionError(f"{expr} returned {len(result)} series, expected {count}")


def serve_collectors(*collectors) -> tuple[object, str]:
    """A /metrics endpoint for the collectors; returns (server, host:port)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return server, f"127.0.0.1:{port}"
