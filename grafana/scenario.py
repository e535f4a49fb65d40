"""The dashboards' proving ground: a simulated incident replayed into a local Prometheus.

Two jobs run side by side for ``minutes`` of (time-scaled) simulated time: ``llm-pretrain``
(dp=4 x tp=2) with a host stall on rank 3 a sixth of the way in and a compute straggler on
rank 5 (mlp x2.5, the job ~25% slower) from a third on, and a ``healthy`` dp=4 job. The
pipeline has trouble too: the processor is unreachable for a minute (the exporters drop and
count batches) and one rank sends a malformed record every few minutes (the processor
rejects and counts it). The history goes through the real exporter collectors and a real
processor (which writes every window's Perfetto file to ``store_url``), is backfilled into
Debian's Prometheus, and, if rule files are given, the recording rules are backfilled over it
too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from argus_grafana.prometheus import LocalPrometheus

STRAGGLER_JOB = "llm-pretrain"
HEALTHY_JOB = "healthy"
STRAGGLER_RANK = 5
STALLED_RANK = 3
STRAGGLER_FACTOR = 2.5
TIME_SCALE = 8.0  # a model 8x bigger than the simulator's: ~1.3 s steps
STEP_S = 0.16 * TIME_SCALE  # roughly, for sizing the run


@dataclass
class Scenario:
    """What was replayed, and the Prometheus holding it (started)."""

    prometheus: LocalPrometheus
    start_s: float
    stall_s: float  # when the host stall happened
    straggler_from_s: float  # when the compute straggler started
    end_s: float
    store_url: str
    recorded_rules: list[str]
    samples: int


def replay(workdir: str | Path, minutes: float = 20.0, store_url: str | None = None,
           rule_files: list[Path] | None = None, seed: int = 0) -> Scenario:
    """Simulate, record, backfill and start Prometheus; the caller stops it."""
    from argus_core.processor.config import ProcessorConfig
    from argus_core.rules.config import PROCESSOR_SCRAPE_JOB
    from argus_core.simulate import SimConfig, parse_fault
    from argus_core.simulate.history import Incidents, record_history
    from argus_core.topology import Topology

    workdir = Path(workdir)
    store_url = store_url or (workdir / "traces").absolute().as_uri()
    steps = int(minutes * 60 / STEP_S)
    straggler = SimConfig(
        job=STRAGGLER_JOB, topology=Topology(dp=4, tp=2), steps=steps, seed=seed,
        faults=(parse_fault(f"stall:ranks={STALLED_RANK}:steps={steps // 6}:seconds=1"),
                parse_fault(f"compute:ranks={STRAGGLER_RANK}:phases=mlp*{STRAGGLER_FACTOR}:"
                            f"from={steps // 3}")))
    healthy = SimConfig(job=HEALTHY_JOB, topology=Topology(dp=4), steps=2 * steps,
                        seed=seed + 1)
    processor = ProcessorConfig(store=store_url, spool_dir=str(workdir / "spool"), window_s=60,
                                grace_s=5)
    duration_s = minutes * 60
    start_ns = time.time_ns() - int((duration_s + 3600) * 1e9)  # ends an hour ago
    history = record_history(
        [straggler, healthy], processor, start_ns, processor_job=PROCESSOR_SCRAPE_JOB,
        time_scale=TIME_SCALE,
        incidents=Incidents(processor_outage=(duration_s * 0.45, duration_s * 0.45 + 60),
                            bad_record_every_s=duration_s / 4))
    prometheus = LocalPrometheus(workdir / "prometheus")
    prometheus.backfill(history.openmetrics())
    prometheus.start()
    start_s, end_s = start_ns / 1e9, history.end_ns / 1e9
    recorded = []
    if rule_files:
        try:
            recorded = prometheus.backfill_rules(rule_files, start_s, end_s)
        except Exception:
            prometheus.stop()
            raise
    stall_s = history.step_start_ns[(STRAGGLER_JOB, steps // 6)] / 1e9
    straggler_s = history.step_start_ns[(STRAGGLER_JOB, steps // 3)] / 1e9
    return Scenario(prometheus, start_s, stall_s, straggler_s, end_s, store_url, recorded,
                    history.samples)
