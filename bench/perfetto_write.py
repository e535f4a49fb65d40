"""Benchmark: Perfetto trace files per (job, rank) window, kernel events per second, one core.

    python bench/perfetto_write.py [--json] [--events 1000000] [--streams 8] [--names 200]

One window of ``--events`` kernels over ``--streams`` CUDA streams (one of them NCCL, with
multi-ms kernels) and ``--names`` kernel names, arriving in completion order across streams as
CUPTI buffers do, plus 150 steps with 4 phases and 60 stack samples. Measured: ``build_trace_gz``
end to end (group and sort by stream, encode, gzip level 1), best of ``--repeats``, with the
default gzip backend and with zlib forced (and ISA-L when the ``isal`` package is installed);
``build_trace`` alone (no gzip); compressed and raw bytes per kernel. The baseline, timed in the
same run, builds the same kernels with ``TraceProtoBuilder``, one BEGIN and one END packet object
per kernel (absolute timestamps, track uuid and interned name on each), serialized and gzipped at
level 1, on a ``--baseline-events`` sample.
"""

from __future__ import annotations

import argparse
import gzip
import time
from collections.abc import Callable

import numpy as np
from _report import report
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from argus_core.processor import perfetto as pf

T0 = 1_790_000_000_000_000_000  # ns since the epoch
TARGET_EVENTS_PER_S = 3_000_000


def workload(events: int, streams: int, names: int, seed: int = 0) -> pf.WindowTrace:
    """One rank's 60 s window: back-to-back kernels per stream, NCCL on the last stream."""
    rng = np.random.default_rng(seed)
    per_stream = np.full(streams, events // streams)
    per_stream[: events % streams] += 1
    parts = []
    for s, count in enumerate(per_stream):
        nccl = s == streams - 1
        dur = np.exp(rng.normal(np.log(2e6 if nccl else 2e4), 1.2, count)).astype(np.int64)
        gap = np.exp(rng.normal(np.log(3e3), 1.5, count)).astype(np.int64)
        offset = np.cumsum(gap) + np.r_[0, np.cumsum(dur)[:-1]]
        scale = min(1.0, 59e9 / (offset[-1] + dur[-1]))  # fit the window: 60 s
        start = T0 + (offset * scale).astype(np.int64)
        dur = np.minimum((dur * scale).astype(np.int64), np.r_[np.diff(start), dur[-1]])
        kernel = rng.integers(names - names // 10, names, count) if nccl else \
            rng.integers(0, names - names // 10, count)
        parts.append((kernel, np.full(count, 7 + s), start, dur))
    kernel, stream, start, dur = (np.concatenate(col) for col in zip(*parts, strict=True))
    order = np.argsort(start + dur, kind="stable")  # completion order, as CUPTI delivers
    steps = [{"step": i, "t_ns": T0 + i * 400_000_000, "wall_s": 0.4, "gpu_s": 0.38,
              "phases": {"forward": 0.12, "backward": 0.2, "optimizer": 0.01,
                         "dp-allreduce": 0.05}} for i in range(150)]
    stacks = [{"t_ns": T0 + i * 1_000_000_000, "thread": "MainThread",
               "frames": ["train.py:<module>:212", "train.py:main:180",
                          "train.py:train_step:96", "torch/_tensor.py:backward:626"]}
              for i in range(60)]
    return pf.WindowTrace(job="bench", rank=0, window_start_ns=T0, window_ns=60_000_000_000,
                          host="node-0", names=[f"kernel_{i}" for i in range(names)],
                          kernel_name=kernel[order].astype(np.int32), stream=stream[order],
                          start_ns=start[order], dur_ns=dur[order], steps=steps, stacks=stacks)


def per_packet_baseline(window: pf.WindowTrace, sample: int) -> tuple[float, int]:
    """TraceProtoBuilder with one packet object per BEGIN/END; returns (events/s, gzip bytes)."""
    names, streams = window.names, np.unique(window.stream[:sample]).tolist()
    start, dur = window.start_ns[:sample].tolist(), window.dur_ns[:sample].tolist()
    kernel, stream = window.kernel_name[:sample].tolist(), window.stream[:sample].tolist()

    def build() -> bytes:
        builder = TraceProtoBuilder()
        head = builder.add_packet()
        head.trusted_packet_sequence_id = 1
        head.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        for iid, name in enumerate(names, start=1):
            entry = head.interned_data.event_names.add()
            entry.iid, entry.name = iid, name
        for s in streams:
            desc = builder.add_packet().track_descriptor
            desc.uuid, desc.name = 1000 + s, f"stream {s}"
        for s, d, k, track in zip(start, dur, kernel, stream, strict=True):
            for ts, kind in ((s, TrackEvent.TYPE_SLICE_BEGIN), (s + d, TrackEvent.TYPE_SLICE_END)):
                packet = builder.add_packet()
                packet.timestamp = ts
                packet.trusted_packet_sequence_id = 1
                packet.sequence_flags = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
                event = packet.track_event
                event.type, event.track_uuid = kind, 1000 + track
                if kind == TrackEvent.TYPE_SLICE_BEGIN:
                    event.name_iid = k + 1
        return gzip.compress(builder.serialize(), compresslevel=1, mtime=0)

    seconds = best_of(build, 3)
    return sample / seconds, len(build())


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Smallest wall time of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(events: int, streams: int, names: int, repeats: int, baseline_events: int) -> dict:
    """All measurements as one flat dict."""
    window = workload(events, streams, names)
    gz = pf.build_trace_gz(window)
    raw = pf.build_trace(window)
    seconds = best_of(lambda: pf.build_trace_gz(window), repeats)
    zlib_s = best_of(lambda: pf.build_trace_gz(window, backend="zlib"), repeats)
    isal_s = best_of(lambda: pf.build_trace_gz(window, backend="isal"), repeats) \
        if pf._isal_zlib is not None else None
    encode_s = best_of(lambda: pf.build_trace(window), repeats)
    base_rate, base_bytes = per_packet_baseline(window, min(baseline_events, events))
    rate = events / seconds
    return {"events": events, "streams": streams, "names": names,
            "gzip_backend": pf.GZIP_BACKEND, "seconds": seconds, "events_per_s": rate,
            "target_events_per_s": TARGET_EVENTS_PER_S,
            "meets_target": rate >= TARGET_EVENTS_PER_S,
            "zlib_events_per_s": events / zlib_s,
            "isal_events_per_s": events / isal_s if isal_s else None,
            "encode_only_events_per_s": events / encode_s,
            "bytes_per_event": len(gz) / events, "raw_bytes_per_event": len(raw) / events,
            "baseline_events": min(baseline_events, events),
            "baseline_events_per_s": base_rate,
            "baseline_bytes_per_event": base_bytes / min(baseline_events, events),
            "speedup_vs_baseline": rate / base_rate}


def main() -> None:
    """Parse arguments, run, print a table or one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--names", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-events", type=int, default=20_000)
    args = parser.parse_args()
    result = run(args.events, args.streams, args.names, args.repeats, args.baseline_events)
    report(result, args.json)


if __name__ == "__main__":
    main()
