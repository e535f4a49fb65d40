"""Perfetto trace files: one (job, rank) window as a protobuf trace for ui.perfetto.dev.

A file is a serialized ``perfetto.protos.Trace`` (a run of ``packet`` fields) on one packet
sequence, written front to back by :class:`TraceWriter` as the window's kernels arrive, so a
window never has to be held in memory whole. The head, built with ``TraceProtoBuilder``: a
first packet that clears the incremental state and holds a clock snapshot saying trace time is
wall time (BOOTTIME == REALTIME, so the UI can show dates), and the track tree: a process track
"rank R (host)" with "steps", "phases (approximate placement)", one track per GPU stream
("stream 7", declared when the stream first appears) and, at the end, "host stacks" (one child
track per sampled Python thread). Each chunk of kernels starts with a packet that clears the
incremental state again and interns the chunk's kernel names (``InternedData.event_names``);
the tail holds the step, phase and stack-sample events.

Each kernel's BEGIN and END packets are encoded in bulk, a chunk at a time, by
``argus_core.processor.perfetto_packets``.

Kernels on one stream are written in start order, each END before the next BEGIN, which is
what trace processor needs to pair BEGIN and END on a track when timestamps tie (zero-length
and back-to-back kernels). CUPTI does not report overlapping kernels on one stream, but if two
overlap the earlier one's end is clipped to the next one's start (slices on a track must nest)
and the number clipped is logged at debug level. Batches reordered in transit are handled by
:class:`TraceWriter` (see there).

Gzip (:class:`GzipWriter`) takes most of the time: zlib level 1 runs at ~100 MB/s on this kind
of data. ISA-L (the optional ``isal`` package) writes the same gzip format about 5x faster and
is used when installed.

Just past 500 lines: the file's head, its event tail and :class:`TraceWriter`'s reordering of
late batches share the track numbering; the numpy packet encoding is ``perfetto_packets``.
"""

from __future__ import annotations

import io
import logging
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    BUILTIN_CLOCK_BOOTTIME,
    BUILTIN_CLOCK_REALTIME,
    TrackDescriptor,
    TrackEvent,
)
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from argus_core.processor.perfetto_packets import (
    CLEARED_STATE,
    PID_BASE,
    SEQUENCE,
    SLICE_BEGIN,
    SLICE_END,
    StreamKernels,
    empty_kernels,
    fixed_width_base,
    group_kernels,
    kernel_packets,
)

_log = logging.getLogger(__name__)

try:  # ISA-L's deflate: the same gzip format, ~5x faster than zlib at level 1 here
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover - depends on the environment
    _isal_zlib = None

GZIP_BACKEND = "isal" if _isal_zlib is not None else "zlib"
"""Which deflate implementation ``build_trace_gz`` uses by default."""


@dataclass
class WindowTrace:
    """Everything one (job, rank) recorded in one window; ``kernel_name`` indexes ``names``."""

    job: str
    rank: int
    window_start_ns: int
    window_ns: int
    host: str = ""
    names: list[str] = field(default_factory=list)
    kernel_name: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    stream: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dur_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    steps: list[dict] = field(default_factory=list)  # schema-v1 step records
    stacks: list[dict] = field(default_factory=list)  # schema-v1 stack records


# --- tracks, steps, phases, stacks ---------------------------------------------------------------


def _get(record: Any, key: str) -> Any:
    """A field of a schema-v1 record given as a dict or as a parsed record object."""
    return record[key] if isinstance(record, Mapping) else getattr(record, key)


def _ns(seconds: Any) -> int:
    """Seconds as whole nanoseconds; missing, negative or non-finite values become 0."""
    value = float(seconds) if seconds is not None else 0.0
    return round(value * 1e9) if math.isfinite(value) and value > 0 else 0


def _slice(builder: TraceProtoBuilder, seq: int, track: int, name: str, begin: int, end: int,
           ) -> TrackEvent:
    """A BEGIN/END packet pair on ``track``; returns the BEGIN event for annotations."""
    first = builder.add_packet()
    first.timestamp, first.trusted_packet_sequence_id = begin, seq
    event = first.track_event
    event.type, event.track_uuid, event.name = SLICE_BEGIN, track, name
    last = builder.add_packet()
    last.timestamp, last.trusted_packet_sequence_id = end, seq
    last.track_event.type, last.track_event.track_uuid = SLICE_END, track
    return event


def _annotate(event: TrackEvent, name: str, value: float | int | str) -> None:
    """Attach one debug annotation (shown under the slice's arguments)."""
    note = event.debug_annotations.add()
    note.name = name
    if isinstance(value, str):
        note.string_value = value
    elif isinstance(value, int):
        note.int_value = value
    else:
        note.double_value = value


def _add_step(builder: TraceProtoBuilder, record: Any, end: int | None, seq: int) -> None:
    """One step as a slice t_ns .. ``end``, its phases laid out back to back inside it.

    Phases have only durations (device time from CUDA events), no start times: they are placed
    sequentially from the step's ``t_ns`` in record order, on the "phases (approximate
    placement)" track, and clipped at the step's end (communication overlapping compute makes
    their sum exceed the wall time); ``measured_s`` keeps each phase's recorded duration, and
    ``with_rank_N_s`` a point-to-point phase's time with rank N.
    """
    if end is None:
        raise ValueError(f"step {_get(record, 'step')}: wall_s {_get(record, 'wall_s')!r} is "
                         "not a duration in ns")
    begin = int(_get(record, "t_ns"))
    event = _slice(builder, seq, _STEPS, f"step {_get(record, 'step')}", begin, end)
    _annotate(event, "wall_s", float(_get(record, "wall_s") or 0.0))
    _annotate(event, "gpu_s", float(_get(record, "gpu_s") or 0.0))
    cpu_wait = (record.get("cpu_wait_s") if isinstance(record, Mapping)
                else getattr(record, "cpu_wait_s", None))
    if cpu_wait is not None:  # how long the training thread waited for a CPU
        _annotate(event, "cpu_wait_s", float(cpu_wait))
    cursor = begin
    peers = (record.get("peers") if isinstance(record, Mapping)
             else getattr(record, "peers", None)) or {}
    for phase, seconds in (_get(record, "phases") or {}).items():
        phase_end = min(cursor + _ns(seconds), end)
        event = _slice(builder, seq, _PHASES, phase, cursor, phase_end)
        _annotate(event, "measured_s", float(seconds or 0.0))
        _annotate(event, "step", int(_get(record, "step")))
        for peer, with_peer in (peers.get(phase) or {}).items():  # a send's or recv's ranks
            seconds = with_peer["s"] if isinstance(with_peer, Mapping) else with_peer.seconds
            _annotate(event, f"with_rank_{int(peer)}_s", float(seconds))
        cursor = phase_end


def _step_ends(ordered: list) -> list[int | None]:
    """Each step's end, t_ns + wall_s, clipped at the next step's start so slices nest
    (None where the duration cannot be read as nanoseconds)."""
    begins = [int(_get(r, "t_ns")) for r in ordered]
    ends: list[int | None] = []
    for i, record in enumerate(ordered):
        try:
            end = begins[i] + _ns(_get(record, "wall_s"))
        except (OverflowError, ValueError, TypeError):
            ends.append(None)
            continue
        ends.append(min(end, begins[i + 1]) if i + 1 < len(ordered) else end)
    return ends


def _callstack(frames: tuple[str, ...]) -> TrackEvent.InlineCallstack:
    """Inline callstack (outermost first) from "file.py:function:line" frame strings."""
    stack = TrackEvent.InlineCallstack()
    for text in frames:
        frame = stack.frames.add()
        parts = text.rsplit(":", 2)
        if len(parts) == 3 and parts[2].isdigit():
            frame.source_file, frame.function_name = parts[0], parts[1]
            frame.line_number = int(parts[2])
        else:
            frame.function_name = text
    return stack


def _add_stack(builder: TraceProtoBuilder, record: Any, track: int, seq: int,
               cache: dict[tuple[str, ...], TrackEvent.InlineCallstack]) -> None:
    """One stack sample as an instant event named by its innermost frame.

    It carries the stack twice: as ``TrackEvent.callstack`` (Perfetto's inline callstack,
    outermost frame first, which the UI aggregates into a flamegraph over a selection) and as a
    ``stack`` debug annotation listing the frames, outermost first, readable in the details.
    """
    frames = tuple(_get(record, "frames") or ())
    packet = builder.add_packet()
    packet.timestamp, packet.trusted_packet_sequence_id = int(_get(record, "t_ns")), seq
    event = packet.track_event
    event.type, event.track_uuid = TrackEvent.TYPE_INSTANT, track
    event.name = frames[-1] if frames else "(empty stack)"
    if frames:
        if frames not in cache:
            cache[frames] = _callstack(frames)
        event.callstack.CopyFrom(cache[frames])
    _annotate(event, "thread", _get(record, "thread") or "")
    note = event.debug_annotations.add()
    note.name = "stack"
    for text in frames:
        note.array_values.add().string_value = text


# --- assembly ----------------------------------------------------------------------------------

_PROCESS, _STEPS, _PHASES, _STACKS = 1, 2, 3, 4  # fixed track uuids of every file
_KERNEL_TRACKS = range(1 << 7, 1 << 14)  # stream tracks: one varint width (2 bytes) for all
_THREAD_TRACK_BASE = 1 << 14  # stack-sample threads: never in kernel packets
_STACKS_RANK = 2**31 - 1  # "host stacks" last among the rank's tracks
_LANE_LIMIT = 16  # sibling ranks reserved per stream (its track and its reordered lanes)


@dataclass
class _Stream:
    """What the writer remembers of one CUDA stream: its tracks and its last kernels."""

    uuid: int  # track of the stream's kernels in arrival order
    written_end: int = -1  # end of the last kernel written on that track
    held: tuple[int, int, int] | None = None  # (start, end, name) of the newest kernel
    lanes: list[list[int]] = field(default_factory=list)  # [uuid, last end] of reordered lanes


class TraceWriter:
    """Writes one (job, rank) window as a Perfetto trace, a chunk of kernels at a time.

    ``write`` receives the serialized trace in pieces (bytes or uint8 arrays) whose
    concatenation is one ``Trace``. The head (clock snapshot, the rank's process, steps and
    phases tracks) is written at once; each :meth:`add_kernels` writes the chunk's new stream
    tracks, one packet that clears the incremental state and interns the chunk's kernel names,
    and the chunk's kernel packets; :meth:`finish` writes the last kernels, the steps, phases
    and stack samples. Memory is one chunk plus one kernel per stream, however long the window.

    Slices on a track must nest, so each stream's newest kernel is held back until the next
    chunk (or ``finish``) shows whether the next kernel starts before it ends, and is then
    clipped exactly as if the window had been written at once. Kernels that arrive after
    later kernels of their stream were already written (batches reordered in transit) go to a
    "reordered" lane of the stream instead of overlapping written slices: nothing is lost and
    no slice is misplaced.
    """

    def __init__(self, write: Callable[[bytes | np.ndarray], Any], *, job: str, rank: int,
                 window_start_ns: int, window_ns: int, host: str = ""):
        self._write = write
        self.job, self.rank = job, rank
        self._streams: dict[int, _Stream] = {}
        self._next_uuid = iter(_KERNEL_TRACKS)
        self._finished = False
        self.clipped = 0  # kernel ends clipped at the next kernel's start
        self.reordered = 0  # kernels written to a reordered lane
        self.kernels = 0  # kernels written
        self.skipped = 0  # steps and stack samples that could not be encoded (left out)
        self._threads: dict[str, int] = {}  # stack-sample thread -> its track
        self._callstacks: dict[tuple[str, ...], TrackEvent.InlineCallstack] = {}
        builder = TraceProtoBuilder()
        first = builder.add_packet()
        first.trusted_packet_sequence_id = SEQUENCE
        first.sequence_flags = CLEARED_STATE
        first.first_packet_on_sequence = True
        # Timestamps are epoch ns: declare trace time (BOOTTIME) equal to wall time (REALTIME)
        # so the UI can show real dates.
        for clock_id in (BUILTIN_CLOCK_BOOTTIME, BUILTIN_CLOCK_REALTIME):
            clock = first.clock_snapshot.clocks.add()
            clock.clock_id, clock.timestamp = clock_id, window_start_ns
        process = self._descriptor(builder, _PROCESS)
        process.process.pid = PID_BASE + rank
        process.process.process_name = f"rank {rank} ({host})" if host else f"rank {rank}"
        process.description = f"job {job}, rank {rank}, window of {window_ns} ns from " \
                              f"{window_start_ns} ns (epoch)"
        process.child_ordering = TrackDescriptor.EXPLICIT
        self._child(builder, _STEPS, "steps", "One slice per training step: t_ns + wall_s.", 0)
        self._child(builder, _PHASES, "phases (approximate placement)",
                    "Phases are device durations without start times: laid back to back from "
                    "the step's start, clipped at its end; measured_s holds the true duration.", 1)
        self._write(builder.serialize())

    @staticmethod
    def _descriptor(builder: TraceProtoBuilder, uuid: int) -> TrackDescriptor:
        packet = builder.add_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        packet.track_descriptor.uuid = uuid
        return packet.track_descriptor

    def _child(self, builder: TraceProtoBuilder, uuid: int, name: str, text: str, rank: int,
               ) -> None:
        desc = self._descriptor(builder, uuid)
        desc.parent_uuid, desc.name, desc.description = _PROCESS, name, text
        desc.sibling_order_rank = rank

    def _track(self, builder: TraceProtoBuilder, stream: int, lane: int) -> int:
        """A new track for a stream (lane 0) or one of its reordered lanes."""
        uuid = next(self._next_uuid, None)
        if uuid is None:
            raise ValueError(f"{self.job} rank {self.rank}: more than {len(_KERNEL_TRACKS)} "
                             "stream tracks in one window")
        name = f"stream {stream}" if lane == 0 else f"stream {stream} (reordered {lane})"
        text = f"GPU kernels on CUDA stream {stream}." if lane == 0 else (
            f"Kernels of CUDA stream {stream} that arrived after later ones were written.")
        order = 16 + (min(max(stream, 0), 1 << 26) << 4) + min(lane, _LANE_LIMIT - 1)
        self._child(builder, uuid, name, text, order)
        return uuid

    def add_kernels(self, names: Sequence[str], name: np.ndarray, stream: np.ndarray,
                    start_ns: np.ndarray, dur_ns: np.ndarray) -> None:
        """Write a chunk of kernels (columns of equal length; ``name`` indexes ``names``)."""
        if self._finished:
            raise RuntimeError("the trace is finished")
        start = np.asarray(start_ns, dtype=np.int64)
        dur = np.asarray(dur_ns, dtype=np.int64)
        name = np.asarray(name)
        stream = np.asarray(stream, dtype=np.int64)
        n = len(start)
        if not len(dur) == len(name) == len(stream) == n:
            raise ValueError("kernel columns have different lengths")
        if n and (int(start.min()) < 0 or int(name.min()) < 0 or int(name.max()) >= len(names)):
            raise ValueError("kernel start before 0 ns or name index outside names")
        end = start + np.maximum(dur, 0)  # a negative duration becomes an instant
        self._write_chunk(names, name.astype(np.int64), stream, start, end, final=False)

    def _write_chunk(self, names: Sequence[str], name: np.ndarray, stream: np.ndarray,
                     start: np.ndarray, end: np.ndarray, final: bool) -> None:
        held = [(s, *state.held) for s, state in self._streams.items() if state.held]
        for state in self._streams.values():
            state.held = None
        if held:
            h_stream, h_start, h_end, h_name = (np.array(c, dtype=np.int64)
                                                for c in zip(*held, strict=True))
            stream, start = np.r_[h_stream, stream], np.r_[h_start, start]
            end, name = np.r_[h_end, end], np.r_[h_name, name]
        if len(start) == 0:
            return
        builder = TraceProtoBuilder()
        late = self._late(stream, start)
        blocks, uuids = [], []
        in_order = ~late if late.any() else slice(None)
        kernels, clipped = group_kernels(stream[in_order], start[in_order], end[in_order],
                                          name[in_order])
        self.clipped += clipped
        if len(kernels.start):
            if not final:  # hold back each stream's newest kernel
                last = kernels.bounds[1:] - 1
                keep = np.ones(len(kernels.start), dtype=bool)
                keep[last] = False
                for b, s in enumerate(kernels.streams.tolist()):
                    self._stream(builder, s).held = (int(kernels.start[last[b]]),
                                                     int(kernels.end[last[b]]),
                                                     int(kernels.name[last[b]]))
                kernels = kernels.take(keep)
            for b, s in enumerate(kernels.streams.tolist()):
                state = self._stream(builder, s)
                if kernels.bounds[b + 1] > kernels.bounds[b]:
                    state.written_end = int(kernels.end[kernels.bounds[b + 1] - 1])
                uuids.append(state.uuid)
            blocks.append(kernels)
        if late.any():
            reordered, clipped = group_kernels(stream[late], start[late], end[late], name[late])
            self.clipped += clipped
            self.reordered += len(reordered.start)
            for b, s in enumerate(reordered.streams.tolist()):
                first = int(reordered.start[reordered.bounds[b]])
                last_end = int(reordered.end[reordered.bounds[b + 1] - 1])
                state = self._streams[s]
                lane = next((lane for lane in state.lanes if lane[1] <= first), None)
                if lane is None:
                    lane = [self._track(builder, s, len(state.lanes) + 1), -1]
                    state.lanes.append(lane)
                lane[1] = last_end
                uuids.append(lane[0])
            blocks.append(reordered)
        kernels = _concat_blocks(blocks)
        if len(kernels.start) == 0:
            self._write(builder.serialize())
            return
        used = np.flatnonzero(np.bincount(kernels.name, minlength=len(names)))
        name_iid = np.zeros(len(names), dtype=np.int64)
        name_iid[used] = fixed_width_base(len(used)) + np.arange(len(used))
        interned = builder.add_packet()
        interned.trusted_packet_sequence_id = SEQUENCE
        interned.sequence_flags = CLEARED_STATE  # this chunk's names replace the last ones
        for i in used.tolist():
            entry = interned.interned_data.event_names.add()
            entry.iid, entry.name = int(name_iid[i]), names[i]
        self._write(builder.serialize())
        self._write(kernel_packets(kernels, name_iid, uuids, SEQUENCE))
        self.kernels += len(kernels.start)

    def _late(self, stream: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Kernels starting before the end of the last kernel written on their stream's track."""
        if not self._streams:
            return np.zeros(len(start), dtype=bool)
        ids = np.fromiter(self._streams, dtype=np.int64, count=len(self._streams))
        ends = np.array([state.written_end for state in self._streams.values()], dtype=np.int64)
        order = np.argsort(ids)
        ids, ends = ids[order], ends[order]
        pos = np.minimum(np.searchsorted(ids, stream), len(ids) - 1)
        return (ids[pos] == stream) & (start < ends[pos])

    def _stream(self, builder: TraceProtoBuilder, stream: int) -> _Stream:
        state = self._streams.get(stream)
        if state is None:
            state = self._streams[stream] = _Stream(self._track(builder, stream, 0))
        return state

    def add_stacks(self, stacks: Iterable) -> None:
        """Write stack samples now (instant events need no neighbours): a window's samples
        never pile up in memory until it closes."""
        if self._finished:
            raise RuntimeError("the trace is finished")
        stacks = list(stacks)
        if not stacks:
            return
        builder = TraceProtoBuilder()
        for thread in sorted({_get(r, "thread") or "" for r in stacks} - set(self._threads)):
            if not self._threads:
                self._child(builder, _STACKS, "host stacks",
                            "Host Python stack samples (py-spy).", _STACKS_RANK)
            uuid = self._threads[thread] = _THREAD_TRACK_BASE + len(self._threads)
            desc = self._descriptor(builder, uuid)
            desc.parent_uuid, desc.name = _STACKS, thread or "(unnamed thread)"
            desc.sibling_order_rank = len(self._threads)
        self._write(builder.serialize())
        self._write_each(stacks, lambda b, r: _add_stack(
            b, r, self._threads[_get(r, "thread") or ""], SEQUENCE, self._callstacks))

    def _write_each(self, records: list, add: Callable[[TraceProtoBuilder, Any], None]) -> None:
        """Encode records all at once; if one cannot be encoded, one by one, leaving out (and
        counting) only the records that fail: one bad record never costs the others."""
        builder = TraceProtoBuilder()
        try:
            for record in records:
                add(builder, record)
            self._write(builder.serialize())
            return
        except Exception:
            pass
        for record in records:
            single = TraceProtoBuilder()
            try:
                add(single, record)
                data = single.serialize()
            except Exception as exc:
                self.skipped += 1
                _log.warning("%s rank %d: left out a record that cannot be encoded (%s: %s)",
                             self.job, self.rank, type(exc).__name__, exc)
                continue
            self._write(data)

    def finish(self, names: Sequence[str], steps: Iterable = (), stacks: Iterable = ()) -> None:
        """Write the held-back kernels, the steps and phases, and the last stack samples."""
        if self._finished:
            return
        empty = np.zeros(0, dtype=np.int64)
        self._write_chunk(names, empty, empty, empty, empty, final=True)
        self.add_stacks(stacks)
        self._finished = True
        ordered = sorted(steps, key=lambda r: int(_get(r, "t_ns")))
        ends = dict(zip(map(id, ordered), _step_ends(ordered), strict=True))
        self._write_each(ordered, lambda b, r: _add_step(b, r, ends[id(r)], SEQUENCE))
        if self.clipped:
            _log.debug("%s rank %d: clipped %d overlapping kernels", self.job, self.rank,
                       self.clipped)


def _concat_blocks(blocks: list[StreamKernels]) -> StreamKernels:
    if len(blocks) == 1:
        return blocks[0]
    if not blocks:
        return empty_kernels()
    offsets = np.cumsum([0] + [len(b.start) for b in blocks[:-1]])
    return StreamKernels(
        np.concatenate([b.streams for b in blocks]),
        np.concatenate([blocks[0].bounds[:1]] + [b.bounds[1:] + o
                                                for b, o in zip(blocks, offsets, strict=True)]),
        *(np.concatenate([getattr(b, f) for b in blocks]) for f in ("start", "end", "name")))


class GzipWriter:
    """A gzip stream written piece by piece into a binary file object (one gzip member).

    ``sync()`` ends the deflate block so everything written so far can be decompressed from
    the file (a crash loses at most what came after); ``close()`` writes the gzip trailer.
    ``backend`` is "zlib" or "isal" (ISA-L, same format, levels 0-3); the default is
    ``GZIP_BACKEND``. Levels above 3 always use zlib.
    """

    def __init__(self, fileobj: Any, level: int = 1, backend: str | None = None):
        backend = backend or GZIP_BACKEND
        if backend == "isal" and _isal_zlib is not None and level <= 3:
            self._zlib = _isal_zlib
        elif backend in ("zlib", "isal"):
            self._zlib = zlib
        else:
            raise ValueError(f"unknown gzip backend {backend!r}")
        self._compressor = self._zlib.compressobj(level, self._zlib.DEFLATED, 31)  # 31: gzip
        self._file = fileobj
        self.bytes_in = 0

    def write(self, data: bytes | np.ndarray) -> None:
        """Compress and append one piece."""
        self.bytes_in += data.nbytes if isinstance(data, np.ndarray) else len(data)
        out = self._compressor.compress(data)
        if out:
            self._file.write(out)

    def sync(self) -> None:
        """Flush the compressor so the file holds a decompressible prefix."""
        self._file.write(self._compressor.flush(self._zlib.Z_SYNC_FLUSH))

    def close(self) -> None:
        """Finish the gzip member (the file object stays open)."""
        self._file.write(self._compressor.flush())


def _write_window(window: WindowTrace, write: Callable[[bytes | np.ndarray], Any]) -> None:
    writer = TraceWriter(write, job=window.job, rank=window.rank,
                         window_start_ns=window.window_start_ns, window_ns=window.window_ns,
                         host=window.host)
    writer.add_kernels(window.names, window.kernel_name, window.stream, window.start_ns,
                       window.dur_ns)
    writer.finish(window.names, window.steps, window.stacks)


def build_trace(window: WindowTrace) -> bytes:
    """Serialize one window as a Perfetto ``Trace`` (uncompressed protobuf bytes)."""
    chunks: list[bytes | np.ndarray] = []
    _write_window(window, chunks.append)
    return b"".join(memoryview(chunk) for chunk in chunks)


def build_trace_gz(window: WindowTrace, level: int = 1, backend: str | None = None) -> bytes:
    """Gzip of ``build_trace(window)``, compressed piece by piece without joining them first.

    ``backend`` is "zlib" or "isal" (see :class:`GzipWriter`).
    """
    out = io.BytesIO()
    gz = GzipWriter(out, level, backend)
    _write_window(window, gz.write)
    gz.close()
    return out.getvalue()
