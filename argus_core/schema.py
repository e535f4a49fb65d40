"""Trace record schema v1: the contract between exporters, Vector, the processor and diagnosis.

One JSON object per NDJSON line. Every record carries ``v`` (1), ``kind``, ``job`` and ``rank``.
This module validates one decoded record at a time and returns it in normalised form; kernel
batches come back as numpy columns so no per-kernel Python object outlives the decode.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

SCHEMA_VERSION = 1
KINDS = ("rank", "step", "kernels", "stack")
AXES = ("dp", "tp", "pp", "ep")
KERNEL_COLUMNS = ("name", "stream", "start_ns", "dur_ns")
PLACEMENT_TEXT = ("gpu", "pci_bus", "nic", "pcie_switch", "rack", "leaf", "spine")
"""String keys of a rank record's optional ``placement`` (where the rank runs)."""
PLACEMENT_INT = ("numa",)
"""Integer keys of ``placement``."""
PLACEMENT_KEYS = ("gpu", "pci_bus", "numa", "nic", "pcie_switch", "rack", "leaf", "spine")
"""Every ``placement`` key, from the GPU out to the network."""

# Bounds: what a real job can produce. Anything beyond is refused naming the field, so no
# absurd value reaches a window (1e300 seconds or a timestamp near 2**64 used to overflow the
# Perfetto writer at window close and take the whole window's file down with it).
MAX_TIMESTAMP_NS = 4_102_444_800 * 10**9
"""Latest record time accepted: 2100-01-01T00:00:00Z (every ``*_ns`` timestamp)."""
MAX_DURATION_NS = 86_400 * 10**9
"""Longest kernel accepted (``dur_ns``): one day. A hung collective times out long before."""
MAX_DURATION_S = 86_400.0
"""Longest step or phase accepted (``wall_s``, ``gpu_s``, ``phases.*``): one day."""
MAX_RANK = 2**31 - 1
"""Largest rank, world size, local rank and coordinate."""
MAX_STEP = 2**53
"""Largest step number (the largest integer every JSON reader keeps exactly)."""
MAX_STREAM = 2**63 - 1
"""Largest CUDA stream id."""
MAX_TEXT = 4096
"""Longest job, host, thread, phase name or stack frame (characters)."""
MAX_KERNEL_NAME = 65_536
"""Longest kernel name (characters; demangled C++ templates run to a few KB)."""
MAX_ITEMS = 4096
"""Most phases in a step, (phase, peer) entries in its ``peers``, and frames in a stack
sample."""
PEER_SLACK_S = 1e-6
"""How much a phase's time with one peer may exceed the phase's own (rounding)."""
MAX_MESSAGES = 2**20
"""Most messages one step's point-to-point phase may count with one peer."""


class SchemaError(ValueError):
    """A record that breaks schema v1; ``field`` names the offending field (dotted path)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class RankRecord:
    """Identity of one rank: where it runs and its position on each parallel axis."""

    job: str
    rank: int
    world_size: int
    host: str
    local_rank: int
    coords: tuple[int, int, int, int]  # in AXES order
    placement: dict[str, str | int] = dataclasses.field(default_factory=dict)  # PLACEMENT_*


class PeerTime(NamedTuple):
    """A point-to-point phase's time with one peer in one step."""

    seconds: float  # the union of its messages' intervals
    count: int  # messages
    shortest_s: float  # the shortest message's interval


@dataclass(frozen=True)
class StepRecord:
    """One training step of one rank: host wall time, device time and per-phase device time."""

    job: str
    rank: int
    step: int
    t_ns: int
    wall_s: float
    gpu_s: float
    phases: dict[str, float]
    gpu_t_ns: int | None = None  # device start on CUPTI's clock (kernels' start_ns); optional
    peers: dict[str, dict[int, PeerTime]] | None = None  # point-to-point phase -> peer rank
    # -> its time with that peer (optional: which rank a send or recv exchanged data with)
    cpu_wait_s: float | None = None  # the training thread's wait for a CPU (optional)


@dataclass(frozen=True)
class KernelBatch:
    """A columnar batch of kernel executions; ``name`` indexes ``names``."""

    job: str
    rank: int
    names: list[str]
    name: np.ndarray  # int32
    stream: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64


@dataclass(frozen=True)
class StackRecord:
    """One host stack sample, outermost frame first."""

    job: str
    rank: int
    t_ns: int
    thread: str
    frames: list[str]


Record = RankRecord | StepRecord | KernelBatch | StackRecord


def _int(rec: dict, field: str, *, minimum: int = 0, maximum: int,
         required: bool = True) -> int | None:
    value = rec.get(field)
    if value is None:
        if required:
            raise SchemaError(field, "missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(field, f"expected an integer, got {type(value).__name__} {value!r:.40}")
    if value < minimum:
        raise SchemaError(field, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise SchemaError(field, f"must be <= {maximum}, got {value!r:.40}")
    return value


def _time_ns(rec: dict, field: str, *, required: bool = True) -> int | None:
    """A timestamp in ns since the epoch, between 0 and :data:`MAX_TIMESTAMP_NS`."""
    return _int(rec, field, maximum=MAX_TIMESTAMP_NS, required=required)


def _str(rec: dict, field: str, *, required: bool = True, limit: int = MAX_TEXT) -> str | None:
    value = rec.get(field)
    if value is None:
        if required:
            raise SchemaError(field, "missing")
        return None
    if not isinstance(value, str) or not value:
        raise SchemaError(field, f"expected a non-empty string, got {value!r:.40}")
    if len(value) > limit:
        raise SchemaError(field, f"longer than {limit} characters ({len(value)})")
    return value


def _seconds(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaError(field, f"expected a number of seconds, got {value!r:.40}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise SchemaError(field, f"must be a finite duration >= 0, got {value}")
    if value > MAX_DURATION_S:
        raise SchemaError(field, f"must be <= {MAX_DURATION_S:.0f} s (one day), got {value:g}")
    return value


def _column(rec: dict, field: str, maximum: int) -> np.ndarray:
    """One integer column, checked value by value so the error names the first bad element.

    Integral floats (1500.0, as some serialisers write) are accepted; booleans, strings,
    fractions, NaN, infinities, negatives and values beyond ``maximum`` are not.
    """
    values = rec.get(field)
    if values is None:
        raise SchemaError(field, "missing")
    if not isinstance(values, list):
        raise SchemaError(field, f"expected an array, got {type(values).__name__}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise SchemaError(f"{field}[{i}]", f"expected an integer, got {v!r:.40}")
        if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
            raise SchemaError(f"{field}[{i}]", f"expected a finite integer, got {v!r}")
        if v < 0:
            raise SchemaError(f"{field}[{i}]", f"must be >= 0, got {v!r}")
        if v > maximum:
            raise SchemaError(f"{field}[{i}]", f"out of range: {v!r} > {maximum}")
    return np.array([int(v) for v in values], dtype=np.int64)


def _coords(rec: dict) -> tuple[int, int, int, int]:
    coords = rec.get("coords", {})
    if coords is None:
        coords = {}
    if not isinstance(coords, dict):
        raise SchemaError("coords", f"expected an object of axis -> index, got {coords!r:.40}")
    unknown = set(coords) - set(AXES)
    if unknown:
        raise SchemaError("coords",
                          f"unknown axis {sorted(unknown)[0]!r} (axes: {', '.join(AXES)})")
    out = []
    for axis in AXES:
        try:
            out.append(_int(coords, axis, maximum=MAX_RANK, required=False) or 0)
        except SchemaError as exc:
            raise SchemaError(f"coords.{axis}", exc.message) from None
    return tuple(out)  # type: ignore[return-value]


def _placement(rec: dict) -> dict[str, str | int]:
    """The optional ``placement`` object; keys this reader does not know are left out (a newer
    exporter may add some), known ones are checked and bounded."""
    placement = rec.get("placement")
    if placement is None:
        return {}
    if not isinstance(placement, dict):
        raise SchemaError("placement", f"expected an object, got {placement!r:.40}")
    if len(placement) > MAX_ITEMS:
        raise SchemaError("placement", f"more than {MAX_ITEMS} keys ({len(placement)})")
    out: dict[str, str | int] = {}
    try:
        for key in PLACEMENT_TEXT:
            if (value := _str(placement, key, required=False)) is not None:
                out[key] = value
        for key in PLACEMENT_INT:
            if (value := _int(placement, key, maximum=MAX_RANK, required=False)) is not None:
                out[key] = value
    except SchemaError as exc:
        raise SchemaError(f"placement.{exc.field}", exc.message) from None
    return out


def parse_record(rec: Any, *, may_hold_bools: bool = True) -> Record:
    """Validate one decoded JSON value against schema v1 and return its typed form.

    Raises SchemaError naming the first offending field; nothing is partially accepted.
    ``may_hold_bools=False`` is the caller's word that the JSON text had no ``true`` or
    ``false`` token (a byte scan of the line): then kernel columns skip the per-value type
    check, the largest cost of a kernel record after decoding.
    """
    if not isinstance(rec, dict):
        raise SchemaError("record", f"expected a JSON object, got {type(rec).__name__}")
    version = rec.get("v")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise SchemaError("v", f"unsupported schema version {version!r} (this reader knows 1)")
    kind = rec.get("kind")
    if kind not in KINDS:
        raise SchemaError("kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    job = _str(rec, "job")
    rank = _int(rec, "rank", maximum=MAX_RANK)
    if kind == "step":
        return _parse_step(rec, job, rank)
    if kind == "kernels":
        return _parse_kernels(rec, job, rank, may_hold_bools)
    if kind == "rank":
        world_size = _int(rec, "world_size", minimum=1, maximum=MAX_RANK + 1)
        if rank >= world_size:
            raise SchemaError("rank", f"rank {rank} outside world_size {world_size}")
        return RankRecord(job, rank, world_size, _str(rec, "host", required=False) or "",
                          _int(rec, "local_rank", maximum=MAX_RANK, required=False) or 0,
                          _coords(rec), _placement(rec))
    return _parse_stack(rec, job, rank)


def _parse_step(rec: dict, job: str, rank: int) -> StepRecord:
    phases = rec.get("phases", {})
    if phases is None:
        phases = {}
    if not isinstance(phases, dict):
        raise SchemaError("phases", f"expected an object of phase -> seconds, got {phases!r:.40}")
    if len(phases) > MAX_ITEMS:
        raise SchemaError("phases", f"more than {MAX_ITEMS} phases ({len(phases)})")
    clean = {}
    for name, value in phases.items():
        if not name:
            raise SchemaError("phases", "empty phase name")
        if len(name) > MAX_TEXT:
            raise SchemaError("phases", f"phase name longer than {MAX_TEXT} characters")
        clean[name] = _seconds(value, f"phases.{name}")
    gpu = rec.get("gpu_s")
    cpu_wait = rec.get("cpu_wait_s")
    return StepRecord(
        job, rank, _int(rec, "step", maximum=MAX_STEP), _time_ns(rec, "t_ns"),
        _seconds(rec.get("wall_s"), "wall_s"),
        math.nan if gpu is None else _seconds(gpu, "gpu_s"), clean,
        _time_ns(rec, "gpu_t_ns", required=False), _peers(rec.get("peers"), clean, rank),
        None if cpu_wait is None else _seconds(cpu_wait, "cpu_wait_s"))


def _peers(peers: Any, phases: dict[str, float], rank: int,
           ) -> dict[str, dict[int, PeerTime]] | None:
    """A step's optional ``peers``: for phases of the step, per peer rank (a decimal string
    key, never the rank itself) ``{"s": seconds, "n": messages, "min_s": shortest message}``,
    the seconds within the phase's and the shortest within them."""
    if peers is None:
        return None
    if not isinstance(peers, dict):
        raise SchemaError("peers", f"expected an object of phase -> {{peer rank: seconds}}, "
                                   f"got {peers!r:.40}")
    clean: dict[str, dict[int, float]] = {}
    entries = 0
    for phase, by_peer in peers.items():
        where = f"peers.{phase}"
        if phase not in phases:
            raise SchemaError(where, "not a phase of this step")
        if not isinstance(by_peer, dict):
            raise SchemaError(where, f"expected an object of peer rank -> {{s, n, min_s}}, "
                                     f"got {by_peer!r:.40}")
        entries += len(by_peer)
        if entries > MAX_ITEMS:
            raise SchemaError("peers", f"more than {MAX_ITEMS} (phase, peer) entries")
        out = clean[phase] = {}
        for key, value in by_peer.items():
            if not (isinstance(key, str) and key.isdigit() and key.isascii()
                    and int(key) <= MAX_RANK):
                raise SchemaError(where, f"peer {key!r:.40} is not a rank (0 to {MAX_RANK})")
            peer = int(key)
            if peer == rank:
                raise SchemaError(f"{where}.{key}", "a rank is not its own peer")
            out[peer] = _peer_time(value, f"{where}.{key}", phases[phase])
    return clean or None


def _peer_time(value: Any, where: str, phase_s: float) -> PeerTime:
    if not isinstance(value, dict):
        raise SchemaError(where, f"expected an object {{s, n, min_s}}, got {value!r:.40}")
    seconds = _seconds(value.get("s"), f"{where}.s")
    if seconds > phase_s + PEER_SLACK_S:
        raise SchemaError(f"{where}.s", f"{seconds} s with this peer exceeds the phase's "
                                        f"{phase_s} s")
    try:
        count = _int(value, "n", minimum=1, maximum=MAX_MESSAGES)
    except SchemaError as exc:  # named by its whole path
        raise SchemaError(f"{where}.n", exc.message) from None
    shortest = _seconds(value.get("min_s"), f"{where}.min_s")
    if shortest > seconds + PEER_SLACK_S:
        raise SchemaError(f"{where}.min_s", f"shortest message {shortest} s exceeds the "
                                            f"{seconds} s of all of them")
    return PeerTime(seconds, count, shortest)


def _int_columns(rec: dict, may_hold_bools: bool = True) -> np.ndarray | None:
    """All four kernel columns as one (4 x n) int64 array when they are equal-length lists of
    plain non-negative ints: the normal case, converted in one call. Anything else returns None
    and goes to the value-by-value path that names the problem.

    numpy's own type inference refuses floats (float64), strings (unicode) and integers beyond
    int64 (object or float64); only a bool among ints would pass as 0 or 1, so the per-value
    type check runs unless the caller saw no bool token in the text."""
    columns = [rec.get(f) for f in KERNEL_COLUMNS]
    if not all(isinstance(c, list) for c in columns):
        return None
    if may_hold_bools and not set(map(type, itertools.chain(*columns))) <= {int}:
        return None
    try:
        array = np.array(columns)
    except (ValueError, OverflowError):  # ragged, or beyond int64
        return None
    if array.ndim != 2 or array.dtype != np.int64 or (array.size and array.min() < 0):
        return None
    if array.size and (array[2].max() > MAX_TIMESTAMP_NS or array[3].max() > MAX_DURATION_NS):
        return None
    return array


def _parse_kernels(rec: dict, job: str, rank: int, may_hold_bools: bool = True) -> KernelBatch:
    names = rec.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise SchemaError("names", "expected an array of non-empty kernel name strings")
    if names and max(map(len, names)) > MAX_KERNEL_NAME:
        raise SchemaError("names", f"a kernel name is longer than {MAX_KERNEL_NAME} characters")
    fast = _int_columns(rec, may_hold_bools)
    if fast is not None:
        name, stream, start, dur = fast
        if len(name) and name.max() < len(names):
            return KernelBatch(job, rank, names, name.astype(np.int32), stream, start, dur)
    name = _column(rec, "name", MAX_STEP)
    columns = {f: _column(rec, f, _COLUMN_MAX[f]) for f in KERNEL_COLUMNS[1:]}
    lengths = {f: len(c) for f, c in (("name", name), *columns.items())}
    if len(set(lengths.values())) != 1:
        detail = ", ".join(f"{f}={n}" for f, n in lengths.items())
        raise SchemaError("kernels", f"columns have different lengths ({detail})")
    if len(name) and name.max() >= len(names):
        bad = int(np.argmax(name >= len(names)))
        raise SchemaError(f"name[{bad}]",
                          f"index {int(name[bad])} outside names (len {len(names)})")
    return KernelBatch(job, rank, names, name.astype(np.int32), columns["stream"],
                       columns["start_ns"], columns["dur_ns"])


_COLUMN_MAX = {"stream": MAX_STREAM, "start_ns": MAX_TIMESTAMP_NS, "dur_ns": MAX_DURATION_NS}


def _parse_stack(rec: dict, job: str, rank: int) -> StackRecord:
    frames = rec.get("frames")
    if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
        raise SchemaError("frames", "expected an array of frame strings")
    if len(frames) > MAX_ITEMS:
        raise SchemaError("frames", f"more than {MAX_ITEMS} frames ({len(frames)})")
    if frames and max(map(len, frames)) > MAX_TEXT:
        raise SchemaError("frames", f"a frame is longer than {MAX_TEXT} characters")
    return StackRecord(job, rank, _time_ns(rec, "t_ns"),
                       _str(rec, "thread", required=False) or "", frames)


def coords_dict(coords: tuple[int, ...]) -> dict[str, int]:
    """Render a coords tuple in AXES order as the schema's ``coords`` object."""
    return dict(zip(AXES, (int(c) for c in coords), strict=True))
