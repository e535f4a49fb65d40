"""Hot metrics of one rank for Prometheus: step and phase time, rolling windows, exporter health.

Counters (``argus_step_seconds_total``, ``argus_phase_seconds_total``...) let rules compute
rates; rolling-window gauges (min, quartiles, median and max of the last N steps) keep a
one-step spike visible even when it falls between two scrapes, and say how much each rank's
steps vary. Everything is produced by one custom collector at scrape time, labelled with the
rank's identity (DESIGN.md). prometheus-client is optional: without it, ``StepMetrics``
still counts and ``serve`` says why it cannot listen.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity


class StepMetrics:
    """Per-rank step statistics, updated by the tracer's resolver (a poll's steps at once),
    read by the scrape thread."""

    def __init__(self, identity: RankIdentity, health: Health, window_steps: int,
                 queue_depth=lambda: 0, clock: str = "device"):
        self.identity = identity
        self.clock = clock  # what times the phases: "device" (CUDA events) or "host"
        self.health = health
        self.queue_depth = queue_depth
        self._lock = threading.Lock()
        self.steps = 0
        self.wall_total = 0.0
        self.gpu_total = 0.0
        self._wall: deque[float] = deque(maxlen=window_steps)
        self.cpu_wait_total = 0.0  # seconds the step-closing thread waited for a CPU
        self._cpu_wait: deque[float] = deque(maxlen=window_steps)  # of the steps that say
        # phase -> [sum of its relative positions in its steps, steps, total seconds, window]
        self._phase_state: dict[str, list] = {}
        self.window_steps = window_steps

    def observe(self, wall_s: float, gpu_s: float, phases: dict[str, float],
                cpu_wait_s: float | None = None) -> None:
        """Add one completed step."""
        self.observe_many([(wall_s, gpu_s, phases, cpu_wait_s)])

    def observe_many(self, steps: list[tuple[float, float, dict[str, float], float | None]],
                     ) -> None:
        """Add completed steps, each (wall seconds, device seconds, seconds per phase in the
        order the phases started, seconds the closing thread waited for a CPU or None),
        under one lock."""
        with self._lock:
            states, walls, waits = self._phase_state, self._wall, self._cpu_wait
            for wall_s, gpu_s, phases, cpu_wait_s in steps:
                self.steps += 1
                self.wall_total += wall_s
                self.gpu_total += gpu_s
                walls.append(wall_s)
                if cpu_wait_s is not None:
                    self.cpu_wait_total += cpu_wait_s
                    waits.append(cpu_wait_s)
                last = max(len(phases) - 1, 1)
                for i, (name, seconds) in enumerate(phases.items()):
                    state = states.get(name)
                    if state is None:
                        state = states[name] = [0.0, 0, 0.0, deque(maxlen=self.window_steps)]
                    state[0] += i / last
                    state[1] += 1
                    state[2] += seconds
                    state[3].append(seconds)

    @property
    def phase_total(self) -> dict[str, float]:
        """Device seconds per phase over every completed step."""
        with self._lock:
            return {name: state[2] for name, state in self._phase_state.items()}

    def phase_order(self) -> list[str]:
        """Phase names in the order they happen within a step (``phases`` arrive in the order
        they started; a phase missing from some steps is placed by its mean position), as
        ``argus diagnose`` orders them: who arrived late at a collective depends on it."""
        with self._lock:
            states = self._phase_state
            return sorted(states, key=lambda name: states[name][0] / states[name][1])

    def window(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(last N wall times, last N times per phase), copied under the lock."""
        with self._lock:
            return np.array(self._wall), {name: np.array(state[3])
                                          for name, state in self._phase_state.items()}

    def cpu_wait_window(self) -> np.ndarray:
        """The CPU waits of the last N steps that carried one (none off Linux)."""
        with self._lock:
            return np.array(self._cpu_wait)

    def collect(self):
        """Prometheus collector protocol: fresh metric families on every scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        base = self.identity.labels()
        names, values = list(base), list(base.values())
        h = self.health
        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        single = (  # (kind, name, help, value): one series each
            (counter, "argus_steps", "Training steps completed.", self.steps),
            (counter, "argus_step_seconds", "Host wall time of completed steps.",
             self.wall_total),
            (counter, "argus_step_gpu_seconds", "Device time of completed steps.",
             self.gpu_total),
            (gauge, "argus_exporter_queue_depth", "Records waiting in the shipper queue.",
             self.queue_depth()),
            (counter, "argus_exporter_shipped_bytes", "Bytes delivered to the sink.",
             h.bytes_shipped),
            (counter, "argus_exporter_shipped_records", "Records delivered to the sink.",
             h.records_shipped),
            (counter, "argus_exporter_export_failures", "Failed export attempts.",
             h.export_failures),
            (counter, "argus_exporter_cpu_seconds",
             "CPU time spent by the exporters (training thread and own threads).",
             h.cpu_seconds),
        )
        for kind, name, doc, value in single:
            family = kind(name, doc, labels=names)
            family.add_metric(values, value)
            yield family

        walls, phase_windows = self.window()
        waits = self.cpu_wait_window()
        if len(waits):  # the scorer's "short of CPU": a rank waiting longer than its peers
            yield from _cpu_wait_families(names, values, self.cpu_wait_total,
                                          float(np.median(waits)))
        labelled = {  # name -> (kind, help, extra labels, [(extra values, value)])
            "argus_phase_seconds": (counter, "Device time per phase of completed steps.",
                                    ["phase"], [([p], v) for p, v in
                                                sorted(self.phase_total.items())]),
            "argus_step_window_seconds": (gauge, "Step wall time over the last N steps.",
                                          ["stat"], [([st], v) for st, v in _stats(walls)]),
            "argus_phase_window_seconds": (
                gauge, "Phase time over the last N steps.", ["phase", "stat"],
                [([p, st], v) for p, series in sorted(phase_windows.items())
                 for st, v in _stats(series)]),
            "argus_exporter_dropped_records": (counter, "Records dropped, by reason.",
                                               ["reason"], [([r], n) for r, n in
                                                            sorted(h.dropped.items())]),
            "argus_exporter_http_retries": (counter, "Batches retried after a busy answer "
                                            "(429, 503) or no connection, by status.", ["status"],
                                            [([s], n) for s, n in
                                             sorted(h.http_retries.items())]),
            "argus_exporter_probe_up": (
                gauge, "1 when a probe runs; 0 with the reason when it does not.",
                ["probe", "state", "reason"],
                [([p, state, reason[:120]], 1.0 if state == "on" else 0.0)
                 for p, (state, reason) in sorted(h.probes.items())]),
        }
        for name, (kind, doc, extra, samples) in labelled.items():
            family = kind(name, doc, labels=[*names, *extra])
            for extra_values, value in samples:
                family.add_metric([*values, *extra_values], value)
            yield family
        order = self.phase_order()
        if order:  # one series per rank: the scorer's arrival-skew waiting needs the order
            family = gauge("argus_phase_order_info", "Phases in the order they happen within "
                           "a step, comma-separated in the label order (value 1).",
                           labels=[*names, "order"])
            family.add_metric([*values, ",".join(order)], 1.0)
            yield family
        clock = gauge("argus_phase_clock_info", "What times the phases (value 1): device "
                      "(CUDA events) or host (the host clock: ranks sharing cores differ more).",
                      labels=[*names, "clock"])
        clock.add_metric([*values, self.clock], 1.0)
        yield clock
        for name, (doc, value) in sorted(h.gauges.copy().items()):  # probes' own gauges
            family = gauge(name, doc, labels=names)
            family.add_metric(values, value)
            yield family


def _cpu_wait_families(names: list[str], values: list[str], total: float, median: float):
    """The CPU wait's counter and its window median."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    counter = CounterMetricFamily("argus_step_cpu_wait_seconds", "Time the thread that closes "
                                  "steps waited for a CPU (Linux's run delay) in completed "
                                  "steps.", labels=names)
    counter.add_metric(values, total)
    yield counter
    window = GaugeMetricFamily("argus_step_cpu_wait_window_seconds", "Median CPU wait of a "
                               "step over the last N steps.", labels=[*names, "stat"])
    window.add_metric([*values, "median"], median)
    yield window


def _stats(series: np.ndarray) -> list[tuple[str, float]]:
    """min, quartiles, median and max of a window: the quartiles give the scorer each
    median's noise (a rank whose steps vary widely has a median that wanders)."""
    if len(series) == 0:
        return []
    low, median, high = np.quantile(series, (0.25, 0.5, 0.75))
    return [("min", float(series.min())), ("p25", float(low)), ("median", float(median)),
            ("p75", float(high)), ("max", float(series.max()))]


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
    except (OSError, OverflowError) as exc:  # taken, a bad address, or a port past 65535
        health.probe_state("metrics", "unavailable", f"cannot listen on {addr}:{port}: {exc}")
        return None
    health.probe_state("metrics", "on", f"{addr}:{port}")
    return server
