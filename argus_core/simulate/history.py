"""A simulated job's metrics history, as Prometheus would have scraped it, for backfilling.

The simulator's records go through the real parts: each rank's records into the exporters'
``StepMetrics`` and ``Health`` (steps observed, records batched and shipped as the shipper
ships them: every ``flush_s`` or ``batch_records``, kernels in one step of ``kernel_duty``),
and the shipped bodies into a real :class:`~argus_core.processor.core.Processor`, which
windows them, writes Perfetto files to its store and serves kernel summaries. The processor
runs on the simulated clock (its ``clock_ns``): its windows close, and its intake judges
record times, as they would have while the job ran. Every ``scrape_s`` of simulated time both
collectors are read, exactly as a scrape would read them (the processor's through its
/metrics collector), and the samples are kept with their timestamp.
:meth:`History.openmetrics` writes them for ``promtool tsdb create-blocks-from openmetrics``.

Simulated time is shifted to start at ``start_ns`` (e.g. two hours ago): Prometheus keeps
recent data, and the history must lie in its past. ``time_scale`` stretches every duration
(a model ``time_scale`` times bigger: same kernels and phases, longer), so a history of many
minutes needs fewer simulated steps. Labels are what Prometheus stores after a scrape with
``honor_labels: true``: the series' own, plus ``instance`` (an exporter per host, one
processor), and ``job`` set to the scrape job where a series has none (processor health).

Pipeline incidents can be injected: a processor outage (the exporters' exports fail and their
batches are dropped and counted, as ``HttpSink`` + ``Shipper`` do), and malformed records
from one rank (the processor rejects them and counts the field).
"""

from __future__ import annotations

import gzip
import math
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from argus_core.processor.config import ProcessorConfig
from argus_core.processor.core import Processor
from argus_core.processor.metrics import ProcessorCollector
from argus_core.simulate.model import SimConfig, retimed, simulate


@dataclass(frozen=True)
class Incidents:
    """Pipeline trouble to replay, in seconds from the start of the history."""

    processor_outage: tuple[float, float] | None = None  # exports fail in [start, end)
    bad_record_every_s: float | None = None  # one rank sends a malformed record this often


@dataclass
class _Rank:
    """One simulated rank's exporter state: its metrics, health and unshipped lines."""

    metrics: object
    health: object
    lines: list[bytes] = field(default_factory=list)
    last_flush_ns: int = 0
    step: int = -1


@dataclass
class _Series:
    """Samples of one series: timestamps (s) and values."""

    times: array = field(default_factory=lambda: array("d"))
    values: array = field(default_factory=lambda: array("d"))


class History:
    """Samples of every series, by metric family, with their help text and type."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, dict[tuple, _Series]]] = {}
        self.end_ns = 0  # time of the last scrape
        self.step_start_ns: dict[tuple[str, int], int] = {}  # (job, step) -> rank 0's start

    def add(self, family, extra: dict[str, str], default_job: str | None, at_s: float) -> None:
        """Record every sample of a prometheus-client metric family at ``at_s``."""
        if family.type not in ("counter", "gauge"):
            raise ValueError(f"{family.name}: only counters and gauges are backfilled")
        _, _, series = self.families.setdefault(
            family.name, (family.type, family.documentation, {}))
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = dict(sample.labels)
            if default_job is not None:
                labels.setdefault("job", default_job)
            labels.update(extra)
            key = (sample.name, tuple(sorted(labels.items())))
            slot = series.get(key)
            if slot is None:
                slot = series[key] = _Series()
            slot.times.append(at_s)
            slot.values.append(float(sample.value))

    @property
    def samples(self) -> int:
        """How many samples the history holds."""
        return sum(len(s.times) for _, _, series in self.families.values()
                   for s in series.values())

    def names(self) -> set[str]:
        """Every sample name (``argus_steps_total``, ``argus_rank_info``...)."""
        return {name for _, _, series in self.families.values() for name, _ in series}

    def openmetrics(self) -> Iterator[str]:
        """The history as OpenMetrics text (one family at a time, ``# EOF`` last)."""
        for family, (kind, doc, series) in sorted(self.families.items()):
            yield f"# HELP {family} {_escape(doc)}\n# TYPE {family} {kind}\n"
            for (name, labels), slot in sorted(series.items()):
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                head = f"{name}{{{label_text}}}" if label_text else name
                yield "".join(f"{head} {_number(v)} {t:.3f}\n"
                              for t, v in zip(slot.times, slot.values, strict=True))
        yield "# EOF\n"


def _escape(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class SimulatedClock:
    """The simulated "now" of a history, in ns: what its processor reads as the time."""

    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def record_history(jobs: list[SimConfig], processor_config: ProcessorConfig, start_ns: int, *,
                   processor_job: str, scrape_s: float = 5.0, flush_s: float = 2.0,
                   batch_records: int = 256,
                   kernel_duty: int = 20, window_steps: int = 32, time_scale: float = 1.0,
                   incidents: Incidents = Incidents(),
                   exporter_instance=lambda job, host: f"{host}:9400",
                   processor_instance: str = "processor-0:9700") -> History:
    """Run ``jobs`` (concurrently, all starting at the same time) through exporters and a
    processor started with ``processor_config`` on the simulated clock, and return what
    scrapes every ``scrape_s`` would have stored, from ``start_ns`` until the first job ends
    (so every job is still running at the last scrape). The processor's own series get the
    scrape job ``processor_job``. The processor writes its windows as it goes and is drained
    (every window written and uploaded) before this returns."""
    from argus_exporters.health import Health
    from argus_exporters.identity import RankIdentity
    from argus_exporters.metrics import StepMetrics

    clock = SimulatedClock(start_ns)
    processor = Processor(processor_config, clock_ns=clock)
    try:
        processor.recover()  # as the service starts: replays what a spool holds, opens the log
        history = History()
        scrape = ProcessorCollector(processor)
        ranks: dict[tuple[str, int], _Rank] = {}
        hosts: dict[tuple[str, int], str] = {}
        streams = [retimed(simulate(config), start_ns, time_scale) for config in jobs]
        pending: list[tuple[int, dict] | None] = [next(stream, None) for stream in streams]
        outage = incidents.processor_outage
        next_bad = incidents.bad_record_every_s

        def flush(key: tuple[str, int], state: _Rank, now_ns: int) -> None:
            lines, state.lines, state.last_flush_ns = state.lines, [], now_ns
            if not lines:
                return
            cpu0 = time.thread_time()
            body = gzip.compress(b"".join(lines), compresslevel=1)
            elapsed = (now_ns - start_ns) / 1e9
            down = outage is not None and outage[0] <= elapsed < outage[1]
            status = 503 if down else processor.ingest(body, "gzip").status
            state.health.add_cpu(time.thread_time() - cpu0)
            if status == 200:
                state.health.shipped(len(lines), sum(len(line) for line in lines))
            else:  # what HttpSink + Shipper do with a batch that was not accepted
                state.health.failed_export()
                state.health.drop("sink_error", len(lines))

        tick_ns = int(scrape_s * 1e9)
        now_ns = start_ns
        while all(record is not None for record in pending):  # until the first job ends
            clock.now_ns = now_ns  # records up to now go in during this tick
            for index, stream in enumerate(streams):
                while pending[index] is not None and _time_of(pending[index][1]) < now_ns:
                    rank, record = pending[index]
                    key = (record["job"], rank)
                    if record["kind"] == "rank":
                        health = Health()
                        identity = RankIdentity(job=record["job"], rank=rank, host=record["host"],
                                                local_rank=record["local_rank"],
                                                world_size=record["world_size"],
                                                coords=record["coords"])
                        state = ranks[key] = _Rank(None, health)
                        state.metrics = StepMetrics(identity, health, window_steps,
                                                    queue_depth=lambda s=state: len(s.lines))
                        for probe in ("phases", "kernels", "stacks", "metrics"):
                            health.probe_state(probe, "on", f"1 step in {kernel_duty}"
                                               if probe == "kernels" else "")
                        hosts[key] = record["host"]
                    state = ranks[key]
                    cpu0 = time.thread_time()
                    if record["kind"] == "step":
                        state.step = record["step"]
                        if rank == 0:
                            history.step_start_ns[(record["job"], record["step"])] = record["t_ns"]
                        state.metrics.observe(record["wall_s"], record["gpu_s"], record["phases"])
                    if record["kind"] != "kernels" or state.step % kernel_duty == 0:
                        state.lines.append(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY)
                                           + b"\n")
                    state.health.add_cpu(time.thread_time() - cpu0)
                    at = _time_of(record)
                    if (len(state.lines) >= batch_records
                            or at - state.last_flush_ns >= flush_s * 1e9):
                        flush(key, state, at)
                    pending[index] = next(stream, None)
            if next_bad is not None and (now_ns - start_ns) / 1e9 >= next_bad and ranks:
                key = min(ranks)
                ranks[key].lines.append(orjson.dumps(
                    {"v": 1, "kind": "step", "job": key[0], "rank": key[1], "step": -1,
                     "t_ns": now_ns, "wall_s": -0.5, "gpu_s": 0.1, "phases": {}}) + b"\n")
                next_bad += incidents.bad_record_every_s
            for key, state in ranks.items():
                if now_ns - state.last_flush_ns >= flush_s * 1e9:
                    flush(key, state, now_ns)
            for future in processor.close_due():
                future.result(120)
            at_s = now_ns / 1e9
            for key, state in ranks.items():
                instance = exporter_instance(key[0], hosts[key])
                for family in state.metrics.collect():
                    history.add(family, {"instance": instance}, None, at_s)
            for family in scrape.collect():
                history.add(family, {"instance": processor_instance}, processor_job, at_s)
            history.end_ns = now_ns
            now_ns += tick_ns
        return history
    finally:
        processor.drain()  # the job ended: its last windows written and uploaded


def _time_of(record: dict) -> int:
    if "t_ns" in record:
        return record["t_ns"]
    if "start_ns" in record:
        return int(record["start_ns"][0])
    return 0
