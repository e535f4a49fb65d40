"""``argus simulate --live``: a simulated job in accelerated real time, through the real
interfaces.

Every simulated host serves its ranks' exporter metrics on its own prometheus-client
``/metrics`` endpoint (the exporters' ``StepMetrics`` collector, labelled as the exporters
label), and every rank ships its records (identity, steps, kernel batches, stack samples) to
the processor with the exporters' own ``Shipper`` and ``HttpSink``: gzip NDJSON POSTs, exactly
as a training job's exporters post them. The endpoints are written to a Prometheus
``file_sd`` targets file.

Time: a healthy step lasts ``step_seconds`` of real time; every simulated time is mapped onto
the wall clock by one affine map (a 2.5 s stall at 0.16 s per simulated step lasts 2.5 x
step_seconds / 0.16 s), so record times, Perfetto files and Prometheus samples line up with
"now". Kernel durations and step and phase times keep their simulated values: they are what
the statistics judge.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from argus_core.simulate.model import JOB_EPOCH_NS, SimConfig, simulate

logger = logging.getLogger("argus_core.simulate.live")


@dataclass(frozen=True)
class LiveConfig:
    """What ``argus simulate --live`` runs."""

    sim: SimConfig
    processor: str | None = None  # http://host:port/v1/records; None: no records posted
    metrics_host: str = "127.0.0.1"
    targets_file: str | None = None  # Prometheus file_sd JSON listing the hosts' /metrics
    step_seconds: float = 0.25  # real duration of a healthy step
    window_steps: int = 32  # the exporters' ARGUS_WINDOW_STEPS
    flush_s: float = 0.5  # shipper flush period

    def __post_init__(self) -> None:
        if self.step_seconds <= 0:
            raise ValueError(f"--step-seconds must be > 0, got {self.step_seconds}")
        if self.processor and (urlparse(self.processor).scheme not in ("http", "https")
                               or not urlparse(self.processor).hostname):
            raise ValueError(f"--processor must be an http(s):// URL (e.g. "
                             f"http://127.0.0.1:9700/v1/records), got {self.processor!r}")


def healthy_step_s(config: SimConfig) -> float:
    """Simulated wall time of a healthy step of this topology (one fault-free step)."""
    for _, record in simulate(replace(config, faults=(), steps=1)):
        if record["kind"] == "step":
            return float(record["wall_s"])
    raise AssertionError("the simulator produced no step")


class _Rank:
    """One simulated rank's exporter side: hot metrics, health and shipper."""

    def __init__(self, record: dict, config: LiveConfig):
        from argus_exporters.config import Settings
        from argus_exporters.health import Health
        from argus_exporters.identity import RankIdentity
        from argus_exporters.metrics import StepMetrics
        from argus_exporters.records import encode
        from argus_exporters.shipper import Shipper
        from argus_exporters.sinks.http import HttpSink

        self.identity = RankIdentity(record["job"], record["rank"], record["world_size"],
                                     record["local_rank"], record["host"], record["coords"])
        self.health = Health()
        self.shipper = None
        if config.processor:
            settings = Settings(enabled=True, sink=config.processor, flush_s=config.flush_s)
            sink = HttpSink(settings, self.identity, self.health)
            self.shipper = Shipper(sink, self.health, settings.queue_records,
                                   settings.batch_records, settings.flush_s)
            self.shipper.submit(encode(record))
        depth = (lambda s=self.shipper: s.depth) if self.shipper else (lambda: 0)
        self.metrics = StepMetrics(self.identity, self.health, config.window_steps, depth)
        self._encode = encode

    def ship(self, record: dict) -> None:
        if self.shipper is not None:
            self.shipper.submit(self._encode(record))


class LiveJob:
    """Runs one simulated job in real time until its steps are done or ``stop()``."""

    def __init__(self, config: LiveConfig):
        self.config = config
        self.speed = healthy_step_s(config.sim) / config.step_seconds  # sim s per real s
        self.ranks: dict[int, _Rank] = {}
        self.servers: dict[str, tuple] = {}  # host -> (server, port)
        self.steps_done = 0
        self.started_ns = 0  # set by start() or run()
        self._stop = threading.Event()

    def start_clock(self) -> None:
        """Fix time zero now (``run`` starts from it), so ``onsets`` can be announced first."""
        self.started_ns = time.time_ns()

    # -- time --------------------------------------------------------------------------------
    def real_ns(self, sim_ns):
        """The wall-clock time (ns) of a simulated time (ns); works on numpy arrays too."""
        return self.started_ns + ((np.asarray(sim_ns) - JOB_EPOCH_NS) / self.speed).astype(
            np.int64)

    def _retime(self, record: dict) -> dict:
        out = dict(record)
        if "t_ns" in out:
            out["t_ns"] = int(self.real_ns(out["t_ns"]))
        if record["kind"] == "kernels":
            out["start_ns"] = self.real_ns(record["start_ns"])
        return out

    # -- endpoints ---------------------------------------------------------------------------
    def _serve_hosts(self) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        by_host: dict[str, list[_Rank]] = defaultdict(list)
        for rank in self.ranks.values():
            by_host[rank.identity.host].append(rank)
        for host, ranks in sorted(by_host.items()):
            registry = CollectorRegistry(auto_describe=False)
            for rank in ranks:
                registry.register(rank.metrics)
            server, _thread = start_http_server(0, addr=self.config.metrics_host,
                                                registry=registry)
            self.servers[host] = (server, server.server_port)
        self._write_targets()

    @property
    def endpoints(self) -> dict[str, str]:
        """host -> its /metrics URL."""
        return {host: f"http://{self.config.metrics_host}:{port}/metrics"
                for host, (_, port) in self.servers.items()}

    def _write_targets(self) -> None:
        if not self.config.targets_file:
            return
        path = Path(self.config.targets_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        targets = [{"targets": [f"{self.config.metrics_host}:{port}"],
                    "labels": {"argus_simulated_host": host}}
                   for host, (_, port) in sorted(self.servers.items())]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(targets, indent=1))
        os.replace(tmp, path)  # Prometheus never reads a half-written file

    # -- running -----------------------------------------------------------------------------
    def onsets(self) -> list[tuple[str, int, float]]:
        """(fault, first step, about when in unix seconds) of every fault, assuming the steps
        before it are healthy: when to expect its alerts."""
        step_s = self.config.step_seconds
        start = (self.started_ns or time.time_ns()) * 1e-9
        out = []
        for fault in self.config.sim.faults:
            first = min(fault.steps) if fault.steps else fault.start
            out.append((str(fault), first, start + first * step_s))
        return out

    def run(self) -> int:
        """Run the job; returns the number of steps done."""
        self.started_ns = self.started_ns or time.time_ns()
        step_records: list[tuple[int, dict]] = []
        current = None
        try:
            for rank, record in simulate(self.config.sim):
                if self._stop.is_set():
                    break
                kind = record["kind"]
                if kind == "rank":
                    self.ranks[rank] = _Rank(record, self.config)
                    continue
                if not self.servers:
                    self._serve_hosts()
                if kind == "step" and record["step"] != current:
                    if step_records:
                        self._finish_step(step_records)
                    step_records, current = [], record["step"]
                step_records.append((rank, record))
            if step_records and not self._stop.is_set():
                self._finish_step(step_records)
        finally:
            self.close()
        return self.steps_done

    def _finish_step(self, records: list[tuple[int, dict]]) -> None:
        """Wait until the step has ended in real time, then expose and ship it."""
        first = next(r for _, r in records if r["kind"] == "step")
        end_ns = int(self.real_ns(first["t_ns"] + int(first["wall_s"] * 1e9)))
        wait = (end_ns - time.time_ns()) * 1e-9
        if wait > 0 and self._stop.wait(wait):
            return
        for rank, record in records:
            state = self.ranks[rank]
            if record["kind"] == "step":
                state.metrics.observe(record["wall_s"], record["gpu_s"], record["phases"])
            state.ship(self._retime(record))
        self.steps_done += 1

    def stop(self) -> None:
        """Stop after the current step (from a signal handler or another thread)."""
        self._stop.set()

    def close(self) -> None:
        """Flush the shippers (2 s for all of them together), stop serving, remove the
        targets file."""
        shippers = [rank.shipper for rank in self.ranks.values() if rank.shipper is not None]
        deadline = time.monotonic() + 2.0
        for shipper in shippers:
            shipper.force_flush(max(0.0, deadline - time.monotonic()))
        for shipper in shippers:
            shipper.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        for server, _port in self.servers.values():
            server.shutdown()
            server.server_close()
        self.servers.clear()
        if self.config.targets_file:
            Path(self.config.targets_file).unlink(missing_ok=True)
