"""Hot metrics of one rank for Prometheus: step and phase time, rolling windows, exporter health.

Counters (``argus_step_seconds_total``, ``argus_phase_seconds_total``...) let rules compute
rates; rolling-window gauges (min, median, max of the last N steps) keep a one-step spike
visible even when it falls between two scrapes. Everything is produced by one custom
collector at scrape time, labelled with the rank's identity (DESIGN.md). prometheus-client is
optional: without it, ``StepMetrics`` still counts and ``serve`` says why it cannot listen.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity


class StepMetrics:
    """Per-rank step statistics, updated from the training thread, read by the scrape thread."""

    def __init__(self, identity: RankIdentity, health: Health, window_steps: int,
                 queue_depth=lambda: 0):
        self.identity = identity
        self.health = health
        self.queue_depth = queue_depth
        self._lock = threading.Lock()
        self.steps = 0
        self.wall_total = 0.0
        self.gpu_total = 0.0
        self.phase_total: dict[str, float] = {}
        self._wall: deque[float] = deque(maxlen=window_steps)
        self._phases: dict[str, deque[float]] = {}
        self.window_steps = window_steps

    def observe(self, wall_s: float, gpu_s: float, phases: dict[str, float]) -> None:
        """Add one completed step."""
        with self._lock:
            self.steps += 1
            self.wall_total += wall_s
            self.gpu_total += gpu_s
            self._wall.append(wall_s)
            for name, seconds in phases.items():
                self.phase_total[name] = self.phase_total.get(name, 0.0) + seconds
                window = self._phases.get(name)
                if window is None:
                    window = self._phases[name] = deque(maxlen=self.window_steps)
                window.append(seconds)

    def window(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(last N wall times, last N times per phase), copied under the lock."""
        with self._lock:
            return np.array(self._wall), {k: np.array(v) for k, v in self._phases.items()}

    def collect(self):
        """Prometheus collector protocol: fresh metric families on every scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        base = self.identity.labels()
        names, values = list(base), list(base.values())

        def family(kind, name, doc, extra=()):
            return kind(name, doc, labels=[*names, *extra])

        steps = family(CounterMetricFamily, "argus_steps", "Training steps completed.")
        steps.add_metric(values, self.steps)
        wall = family(CounterMetricFamily, "argus_step_seconds",
                      "Host wall time of completed steps.")
        wall.add_metric(values, self.wall_total)
        gpu = family(CounterMetricFamily, "argus_step_gpu_seconds",
                     "Device time of completed steps.")
        gpu.add_metric(values, self.gpu_total)
        phase = family(CounterMetricFamily, "argus_phase_seconds",
                       "Device time per phase of completed steps.", ["phase"])
        for name, seconds in sorted(self.phase_total.items()):
            phase.add_metric([*values, name], seconds)
        walls, phase_windows = self.window()
        step_window = family(GaugeMetricFamily, "argus_step_window_seconds",
                             "Step wall time over the last N steps.", ["stat"])
        phase_window = family(GaugeMetricFamily, "argus_phase_window_seconds",
                              "Phase time over the last N steps.", ["phase", "stat"])
        for stat, value in _stats(walls):
            step_window.add_metric([*values, stat], value)
        for name, series in sorted(phase_windows.items()):
            for stat, value in _stats(series):
                phase_window.add_metric([*values, name, stat], value)
        yield from (steps, wall, gpu, phase, step_window, phase_window)
        yield from self._health(family, values)

    def _health(self, family, values):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        h = self.health
        depth = family(GaugeMetricFamily, "argus_exporter_queue_depth",
                       "Records waiting in the shipper queue.")
        depth.add_metric(values, self.queue_depth())
        dropped = family(CounterMetricFamily, "argus_exporter_dropped_records",
                         "Records dropped, by reason.", ["reason"])
        for reason, n in sorted(h.dropped.items()):
            dropped.add_metric([*values, reason], n)
        shipped = family(CounterMetricFamily, "argus_exporter_shipped_bytes",
                         "Bytes delivered to the sink.")
        shipped.add_metric(values, h.bytes_shipped)
        records = family(CounterMetricFamily, "argus_exporter_shipped_records",
                         "Records delivered to the sink.")
        records.add_metric(values, h.records_shipped)
        failures = family(CounterMetricFamily, "argus_exporter_export_failures",
                          "Failed export attempts.")
        failures.add_metric(values, h.export_failures)
        cpu = family(CounterMetricFamily, "argus_exporter_cpu_seconds",
                     "CPU time spent by the exporters (training thread and own threads).")
        cpu.add_metric(values, h.cpu_seconds)
        probes = family(GaugeMetricFamily, "argus_exporter_probe_up",
                        "1 when a probe runs; 0 with the reason when it does not.",
                        ["probe", "state", "reason"])
        for probe, (state, reason) in sorted(h.probes.items()):
            probes.add_metric([*values, probe, state, reason[:120]], 1.0 if state == "on" else 0)
        yield from (depth, dropped, shipped, records, failures, cpu, probes)


def _stats(series: np.ndarray) -> list[tuple[str, float]]:
    if len(series) == 0:
        return []
    return [("min", float(series.min())), ("median", float(np.median(series))),
            ("max", float(series.max()))]


def serve(metrics: StepMetrics, port: int, addr: str, health: Health):
    """Start the /metrics endpoint on ``port`` (a fresh registry); None when it cannot."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        health.probe_state("metrics", "unavailable", "prometheus-client is not installed")
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        health.probe_state("metrics", "unavailable", f"cannot listen on {addr}:{port}: {exc}")
        return None
    health.probe_state("metrics", "on", f"{addr}:{port}")
    return server
