"""Schema-v1 records as the exporters emit them (see DESIGN.md), encoded once with orjson."""

from __future__ import annotations

import numpy as np
import orjson

from argus_exporters.identity import RankIdentity

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def encode(record: dict) -> bytes:
    """One NDJSON line (numpy arrays serialised natively, no per-element Python objects)."""
    return orjson.dumps(record, option=_OPTIONS)


def rank_record(identity: RankIdentity) -> dict:
    """The ``rank`` record announcing this rank's identity (``placement`` once known)."""
    record = {"v": 1, "kind": "rank", "job": identity.job, "rank": identity.rank,
              "world_size": identity.world_size, "host": identity.host,
              "local_rank": identity.local_rank, "coords": identity.coords}
    if identity.placement:
        record["placement"] = dict(identity.placement)
    return record


def _ns(seconds: float) -> float:
    """Seconds rounded to the nanosecond: the nearest double to a whole number of ns, as
    ``round(seconds, 9)`` gives at a third of its cost (a NaN or infinity is kept as is)."""
    try:
        return round(seconds * 1e9) / 1e9
    except (ValueError, OverflowError):
        return seconds


def step_record(identity: RankIdentity, step: int, t_ns: int, wall_s: float, gpu_s: float,
                phases: dict[str, float], gpu_t_ns: int | None = None,
                peers: dict[str, dict[int, tuple[float, int, float]]] | None = None,
                cpu_wait_s: float | None = None) -> dict:
    """One ``step`` record: host wall time, device time and per-phase device time.

    ``t_ns`` is host CLOCK_REALTIME at the step's start; ``gpu_t_ns`` (device marks only) is
    when its work started on the device, on CUPTI's clock like kernels' ``start_ns``;
    ``peers`` each point-to-point phase's (seconds, messages, shortest message's seconds)
    per peer rank; ``cpu_wait_s`` how long the thread that closed the step waited for a CPU
    during it (Linux's run delay; None where the kernel keeps no count).
    """
    record = {"v": 1, "kind": "step", "job": identity.job, "rank": identity.rank, "step": step,
              "t_ns": t_ns, "wall_s": _ns(wall_s), "gpu_s": _ns(gpu_s),
              "phases": {k: _ns(v) for k, v in phases.items()}}
    if gpu_t_ns is not None:
        record["gpu_t_ns"] = int(gpu_t_ns)
    if cpu_wait_s is not None:
        record["cpu_wait_s"] = _ns(cpu_wait_s)
    if peers:
        record["peers"] = {phase: {str(peer): {"s": _ns(s), "n": n, "min_s": _ns(m)}
                                   for peer, (s, n, m) in by.items()}
                           for phase, by in peers.items()}
    return record


def kernels_record(identity: RankIdentity, names: list[str], name: np.ndarray,
                   stream: np.ndarray, start_ns: np.ndarray, dur_ns: np.ndarray) -> dict:
    """A columnar ``kernels`` batch; ``name`` indexes ``names``."""
    return {"v": 1, "kind": "kernels", "job": identity.job, "rank": identity.rank,
            "names": names, "name": name, "stream": stream, "start_ns": start_ns,
            "dur_ns": dur_ns}


def stack_record(identity: RankIdentity, t_ns: int, thread: str, frames: list[str]) -> dict:
    """One host stack sample, outermost frame first."""
    return {"v": 1, "kind": "stack", "job": identity.job, "rank": identity.rank, "t_ns": t_ns,
            "thread": thread, "frames": frames}
