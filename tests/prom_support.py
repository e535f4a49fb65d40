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
from argus_core.simulate.summaries import synthetic_summaries
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


class PhaseCluster:
    """What a cluster's processors and exporters expose to a test's Prometheus: per job, kernel
    summaries, identities, phase medians and totals, step counts and step times of ``ranks``
    ranks in pipeline stages of 8 (the scorer fetches and scores stages one at a time).

    ``slow`` maps a job to its slow rank (2x kernels, ``mlp_ratio`` x mlp) or None; ``silent``
    ranks are announced to a processor but never summarised; ``anonymous`` (job, rank) pairs
    are summarised but never announced; ``clocks`` maps a job to the clock its exporters say
    times the phases (``argus_phase_clock_info``; none said for a job not in it)."""

    def __init__(self, ranks: int, slow: dict[str, int | None],
                 silent: dict[str, int] | None = None,
                 anonymous: tuple[str, int] | None = None,
                 clocks: dict[str, str] | None = None, mlp_ratio: float = 2.0):
        self.started = time.time()
        self.ranks, self.slow = ranks, slow
        self.silent, self.anonymous = silent or {}, anonymous
        self.clocks, self.mlp_ratio = clocks or {}, mlp_ratio
        self.summaries = {job: synthetic_summaries(ranks, 4, slow=None if rank is None
                                                   else {rank: 2.0}, seed=i)
                          for i, (job, rank) in enumerate(slow.items())}

    def collect(self):
        """Prometheus collector protocol."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from argus_core.summaries import summary_families

        yield from summary_families(self.summaries)
        labels = ["job", "rank", "host", "dp", "tp", "pp", "ep"]
        info = GaugeMetricFamily("argus_rank_info", "identity", labels=labels)
        phases = GaugeMetricFamily("argus_phase_window_seconds", "phase time",
                                   labels=[*labels, "phase", "stat"])
        totals = CounterMetricFamily("argus_phase_seconds", "phase time",
                                     labels=[*labels, "phase"])
        steps = CounterMetricFamily("argus_steps", "steps", labels=labels)
        walls = GaugeMetricFamily("argus_step_window_seconds", "step time",
                                  labels=[*labels, "stat"])
        orders = GaugeMetricFamily("argus_phase_order_info", "order",
                                   labels=[*labels, "order"])
        clocks = GaugeMetricFamily("argus_phase_clock_info", "clock", labels=[*labels, "clock"])
        elapsed = time.time() - self.started
        for job, slow_rank in self.slow.items():
            silent = [self.silent[job]] if job in self.silent else []
            for rank in [*range(self.ranks), *silent]:
                ident = [job, str(rank), f"node-{rank // 8}", str(rank % 8), "0",
                         str(rank // 8 if rank < self.ranks else 0), "0"]
                if (job, rank) != self.anonymous:
                    info.add_metric(ident, 1)
                if rank in silent:
                    continue
                mlp = 0.03 * (self.mlp_ratio if rank == slow_rank else 1.0)
                for phase, seconds in (("mlp", mlp), ("dp-allreduce", 0.01)):
                    phases.add_metric([*ident, phase, "median"], seconds)
                    totals.add_metric([*ident, phase], seconds * 10 * elapsed)
                steps.add_metric(ident, 10 * elapsed)
                walls.add_metric([*ident, "median"], 0.1)
                orders.add_metric([*ident, "mlp,dp-allreduce"], 1)
                if job in self.clocks:
                    clocks.add_metric([*ident, self.clocks[job]], 1)
        yield from (info, phases, totals, steps, walls, orders, clocks)
