"""A real Alertmanager (Debian's ``prometheus-alertmanager``) on a loopback port, for tests
that post alerts to it and read back what it did with them."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from promtools import binary
from support import free_port

from argus_core.rules.generate import to_yaml
from argus_core.stack.processes import start, wait_ready


class Alertmanager:
    """``prometheus-alertmanager`` with one config file, on a free loopback port."""

    def __init__(self, workdir: Path, config_file: Path, keep_webhooks: bool = False):
        config = yaml.safe_load(config_file.read_text())
        dead = f"http://127.0.0.1:{free_port()}/alerts"  # notifications fail, harmlessly
        for receiver in config["receivers"] if not keep_webhooks else ():
            for webhook in receiver.get("webhook_configs", ()):
                webhook["url"] = dead
        self.config_file = workdir / "alertmanager.yml"
        self.config_file.write_text(to_yaml(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process = start("alertmanager", [
            binary("prometheus-alertmanager"), f"--config.file={self.config_file}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
            "--cluster.listen-address="], workdir / "logs")
        wait_ready(self.process, self.url + "/-/ready", timeout=60)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        self.process.stop()

    def _call(self, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else None

    def post(self, alerts: list[dict[str, str]], started: datetime | None = None) -> None:
        """Fire ``alerts`` (label sets), started at ``started`` (now), for the next hour."""
        now = datetime.now(UTC)
        self._call("/api/v2/alerts", [
            {"labels": labels, "startsAt": _iso(started or now),
             "endsAt": _iso(now + timedelta(hours=1))} for labels in alerts])

    def silence(self, **labels: str) -> str:
        """Silence every alert with these labels for an hour; returns the silence's id."""
        now = datetime.now(UTC)
        body = {"matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True}
                             for k, v in labels.items()],
                "startsAt": _iso(now), "endsAt": _iso(now + timedelta(hours=1)),
                "createdBy": "test_inhibition", "comment": "a known cause"}
        return self._call("/api/v2/silences", body)["silenceID"]

    def alerts(self) -> list[dict]:
        """Every alert Alertmanager holds, with its status."""
        return self._call("/api/v2/alerts")


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
