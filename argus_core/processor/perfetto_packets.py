"""Perfetto's wire format for kernels: BEGIN and END packets for a whole chunk at once, in numpy.

Each kernel is a ``TYPE_SLICE_BEGIN`` and a ``TYPE_SLICE_END`` packet carrying ``timestamp``
(absolute ns), ``trusted_packet_sequence_id``, ``sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE``
and a ``track_event`` with ``type``, ``track_uuid`` and, on BEGIN, ``name_iid``. Their bytes are
computed here with numpy for a whole chunk at once (no Python object per kernel), fields in
field-number order so that each packet is byte for byte what protobuf itself would serialize.
Interned name ids and stream track uuids are drawn from one varint width class, so in the usual
case (epoch timestamps, all 9 varint bytes) every kernel has the same layout and the packets
are plain whole-column writes into one byte matrix.

Field tags are read from the generated descriptors at import (a change in perfetto's protos
fails loudly here rather than writing a different format). ``argus_core.processor.perfetto``
assembles the files.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

_LEN_TYPES = (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_STRING)
_VARINT_TYPES = (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_UINT32,
                 FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_INT32,
                 FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_BOOL)


def _tag(message: Any, name: str) -> int:
    """One-byte protobuf tag (field number << 3 | wire type) of a field, from its descriptor."""
    fd = message.DESCRIPTOR.fields_by_name[name]
    if fd.type in _LEN_TYPES:
        wire = 2
    elif fd.type in _VARINT_TYPES:
        wire = 0
    else:  # pragma: no cover - would mean the protos changed under us
        raise TypeError(f"{message.DESCRIPTOR.name}.{name} is neither varint nor length-delimited")
    tag = fd.number << 3 | wire
    if tag >= 0x80:  # pragma: no cover
        raise ValueError(f"{message.DESCRIPTOR.name}.{name}: tag {tag} needs more than one byte")
    return tag


_T_PACKET = _tag(Trace, "packet")  # field 1, length-delimited
_T_TIMESTAMP = _tag(TracePacket, "timestamp")  # field 8
_T_SEQUENCE_ID = _tag(TracePacket, "trusted_packet_sequence_id")  # field 10
_T_TRACK_EVENT = _tag(TracePacket, "track_event")  # field 11, length-delimited
_T_SEQUENCE_FLAGS = _tag(TracePacket, "sequence_flags")  # field 13
_T_TYPE = _tag(TrackEvent, "type")  # field 9
_T_NAME_IID = _tag(TrackEvent, "name_iid")  # field 10
_T_TRACK_UUID = _tag(TrackEvent, "track_uuid")  # field 11
SLICE_BEGIN = TrackEvent.TYPE_SLICE_BEGIN
SLICE_END = TrackEvent.TYPE_SLICE_END
_NEEDS_STATE = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
CLEARED_STATE = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
SEQUENCE = 1  # the one packet sequence of a file
PID_BASE = 1_000_000  # synthetic pid = PID_BASE + rank (pid 0 is the kernel's idle task)
_WIDTH_BASES = (1, 1 << 7, 1 << 14, 1 << 21, 1 << 28, 1 << 35)


def _varint_width(value: int) -> int:
    """Bytes of the canonical varint encoding of a non-negative integer."""
    return max(1, (int(value).bit_length() + 6) // 7)


def fixed_width_base(count: int) -> int:
    """Smallest first id such that ``count`` consecutive ids all have the same varint width.

    Interned name ids and sequence ids only need to be distinct and non-zero, so picking them
    from one width class makes every kernel packet's layout identical up to its timestamps.
    """
    for base, nxt in itertools.pairwise(_WIDTH_BASES):
        if base + count <= nxt:
            return base
    raise ValueError(f"{count} ids do not fit a fixed-width varint class")


def _write_varints(values: np.ndarray, out: np.ndarray, present: np.ndarray | None = None,
                   ) -> np.ndarray:
    """Encode non-negative integers as protobuf varints into the rows of ``out`` (n x width).

    Byte k of row i is written to ``out[i, k]`` and, if given, ``present[i, k]`` says whether
    the value uses it (bytes past a value's length are zero and must be dropped). ``width`` must
    be at least the longest encoding. Returns the encoded lengths (uint8). Whole-array numpy.
    """
    width = out.shape[1]
    small = width <= 4 or (len(values) and int(values.max()) < 1 << 32)
    rest = values.astype(np.uint32 if small else np.uint64)  # a copy: shifted in place below
    seven = rest.dtype.type(7)
    lengths = np.ones(len(rest), dtype=np.uint8)
    if present is not None:
        present[:, 0] = True
    for k in range(width):
        byte = rest.astype(np.uint8)  # the low 8 bits
        byte &= 0x7F
        rest >>= seven
        if k + 1 < width:
            more = rest != 0  # continuation bit: anything left after these 7 bits
            byte |= more.view(np.uint8) << 7
            if present is not None:
                present[:, k + 1] = more
            lengths += more
        out[:, k] = byte
    return lengths


_SPREAD = [(0x000000000FFFFFFF, 0x00FFFFFFF0000000, 4),  # 28-bit halves into 32-bit lanes
           (0x00003FFF00003FFF, 0x0FFFC0000FFFC000, 2),  # 14-bit quarters into 16-bit lanes
           (0x007F007F007F007F, 0x3F803F803F803F80, 1)]  # 7-bit groups into bytes


def _write_fixed_varints(values: np.ndarray, out: np.ndarray) -> None:
    """``_write_varints`` for values < 2**63 whose encodings all have ``out.shape[1]`` bytes.

    Spreads the low 56 bits into eight 7-bit groups, one per byte of a uint64 (three
    mask-and-shift steps on whole arrays), sets the continuation bits with one OR, and copies
    the little-endian bytes out; a 9th byte, if any, is the top 7 bits.
    """
    width = out.shape[1]
    if width > 9:
        _write_varints(values, out)
        return
    unsigned = values.view(np.uint64) if values.dtype == np.int64 else values.astype(np.uint64)
    spread = unsigned & np.uint64((1 << 56) - 1)
    for keep, move, shift in _SPREAD:
        moved = spread & np.uint64(move)
        moved <<= np.uint64(shift)
        spread &= np.uint64(keep)
        spread |= moved
    spread |= np.uint64(int.from_bytes(b"\x80" * (width - 1), "little"))
    groups = spread.astype("<u8", copy=False).view(np.uint8).reshape(len(values), 8)
    out[:, :min(width, 8)] = groups[:, :width]
    if width == 9:
        out[:, 8] = (unsigned >> np.uint64(56)).astype(np.uint8)


def encode_varints(values: Iterable[int] | np.ndarray) -> list[bytes]:
    """Canonical protobuf varint of each value (uint64 range), via the vectorised encoder."""
    array = np.asarray(values, dtype=np.uint64)
    width = _varint_width(int(array.max())) if len(array) else 1
    out = np.zeros((len(array), width), dtype=np.uint8)
    present = np.zeros((len(array), width), dtype=bool)
    _write_varints(array, out, present)
    return [row[mask].tobytes() for row, mask in zip(out, present, strict=True)]


# --- kernels -----------------------------------------------------------------------------------


@dataclass
class StreamKernels:
    """Kernels grouped in blocks (``bounds[b]:bounds[b+1]``, one per stream), sorted by start."""

    streams: np.ndarray  # stream id of each block
    bounds: np.ndarray  # block boundaries, len(streams) + 1
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray  # index into the window's names

    def take(self, keep: np.ndarray) -> StreamKernels:
        """The kernels selected by a boolean mask, blocks kept (possibly empty)."""
        bounds = np.zeros_like(self.bounds)
        np.cumsum(np.add.reduceat(keep, self.bounds[:-1]) if len(self.start) else
                  np.zeros(len(self.streams), dtype=np.int64), out=bounds[1:])
        return StreamKernels(self.streams, bounds, self.start[keep], self.end[keep],
                              self.name[keep])


def empty_kernels() -> StreamKernels:
    empty = np.zeros(0, dtype=np.int64)
    return StreamKernels(empty, np.zeros(1, dtype=np.int64), empty, empty, empty)


def _dense_ids(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct stream ids (sorted) and each kernel's index among them (small dtype)."""
    lo, hi = int(stream.min()), int(stream.max())
    if hi - lo < 1 << 20:
        shifted = stream - lo
        counts = np.bincount(shifted, minlength=hi - lo + 1)
        present = np.flatnonzero(counts)
        lut = np.zeros(hi - lo + 1, dtype=np.int64)
        lut[present] = np.arange(len(present))
        streams, index = present + lo, lut[shifted]
    else:
        streams, index = np.unique(stream, return_inverse=True)
    # uint8/uint16 keys let numpy's stable argsort use a radix sort.
    dtype = np.uint8 if len(streams) <= 1 << 8 else np.uint16 if len(streams) <= 1 << 16 else None
    return streams, index.astype(dtype) if dtype else index


def group_kernels(stream: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray,
                   ) -> tuple[StreamKernels, int]:
    """Group kernels by stream, sort each stream by start, and clip overlaps on a stream.

    Returns the grouped kernels and how many ends were clipped.
    """
    n = len(start)
    if n == 0:
        return empty_kernels(), 0
    streams, index = _dense_ids(stream)
    bounds = np.zeros(len(streams) + 1, dtype=np.int64)
    np.cumsum(np.bincount(index, minlength=len(streams)), out=bounds[1:])
    order = np.argsort(index, kind="stable") if len(streams) > 1 else None
    start_s = start[order] if order is not None else start
    # CUPTI delivers a stream's kernels in order, so this is normally one cheap check.
    backwards = start_s[1:] < start_s[:-1]
    backwards[bounds[1:-1] - 1] = False  # a new stream's block may start earlier
    if backwards.any():
        order = np.arange(n) if order is None else order
        for s in np.unique(np.searchsorted(bounds, np.flatnonzero(backwards) + 1, "right") - 1):
            block = slice(bounds[s], bounds[s + 1])
            order[block] = order[block][np.argsort(start[order[block]], kind="stable")]
        start_s = start[order]
    end_s = end[order] if order is not None else end.copy()
    name_s = name[order] if order is not None else name
    overlap = end_s[:-1] > start_s[1:]
    overlap[bounds[1:-1] - 1] = False
    clipped = int(np.count_nonzero(overlap))
    if clipped:
        end_s[:-1][overlap] = start_s[1:][overlap]
    return StreamKernels(streams, bounds, start_s, end_s, name_s), clipped


def kernel_packets(kernels: StreamKernels, name_iid: np.ndarray, track_uuid: list[int],
                    seq: int) -> np.ndarray:
    """Bytes of every kernel's BEGIN and END packet, as Trace ``packet`` fields, in one buffer.

    ``name_iid`` maps a name index to its interned id; ``track_uuid`` gives each stream block's
    track (ids of one varint width each). Each kernel is one row of a byte matrix, two packets
    with their fields in field-number order (what protobuf itself writes):

      BEGIN: 0A len | 40 start | 50 seq | 5A te_len 48 01 50 iid 58 uuid | 68 02
      END:   0A len | 40 end   | 50 seq | 5A te_len 48 02 58 uuid        | 68 02

    Everything but the timestamps has a fixed width, so rows are filled with whole-column numpy
    assignments. Timestamps are varints too; when they do not all have the same length (not
    the case for epoch times, which all take 9 bytes) the rows are squeezed with a mask.
    """
    n = len(kernels.start)
    seq_bytes = encode_varints([seq])[0]
    uuid_width = _varint_width(max(track_uuid))
    iid_width = _varint_width(int(name_iid.max()))  # every used name's iid has this width
    iid_bytes = np.zeros((len(name_iid), iid_width), dtype=np.uint8)
    _write_varints(name_iid, iid_bytes)
    lo, hi = int(kernels.start.min()), int(kernels.end.max())
    ts_width = _varint_width(hi)
    uniform = _varint_width(lo) == ts_width

    uuid = [_T_TRACK_UUID, *[0] * uuid_width]
    event_begin = [_T_TYPE, SLICE_BEGIN, _T_NAME_IID, *[0] * iid_width, *uuid]
    event_end = [_T_TYPE, SLICE_END, *uuid]
    tail_begin = [_T_SEQUENCE_ID, *seq_bytes, _T_TRACK_EVENT, len(event_begin), *event_begin,
                  _T_SEQUENCE_FLAGS, _NEEDS_STATE]
    tail_end = [_T_SEQUENCE_ID, *seq_bytes, _T_TRACK_EVENT, len(event_end), *event_end,
                _T_SEQUENCE_FLAGS, _NEEDS_STATE]
    # column positions: [0A len 40 | start | tail_begin] [0A len 40 | end | tail_end]
    b_ts = 3
    b_tail = b_ts + ts_width
    e_tag = b_tail + len(tail_begin)
    e_ts = e_tag + 3
    e_tail = e_ts + ts_width
    width = e_tail + len(tail_end)
    b_iid = b_tail + 1 + len(seq_bytes) + 2 + 3  # after 50 seq, 5A te_len, 48 01 50
    e_uuid = e_tail + 1 + len(seq_bytes) + 2 + 3  # after 50 seq, 5A te_len, 48 02 58
    b_uuid = b_iid + iid_width + 1
    template = np.zeros(width, dtype=np.uint8)
    template[[0, e_tag]] = _T_PACKET
    template[[2, e_tag + 2]] = _T_TIMESTAMP
    template[b_tail:e_tag] = tail_begin
    template[e_tail:] = tail_end

    rows = np.empty((n, width), dtype=np.uint8)
    for s, track in enumerate(track_uuid):
        uuid_bytes = list(encode_varints([track])[0])
        template[b_uuid:b_uuid + uuid_width] = template[e_uuid:e_uuid + uuid_width] = uuid_bytes
        rows[kernels.bounds[s]:kernels.bounds[s + 1]] = template
    rows[:, b_iid:b_iid + iid_width] = np.take(iid_bytes, kernels.name, axis=0)  # 5x [] here
    if uniform:
        _write_fixed_varints(kernels.start, rows[:, b_ts:b_tail])
        _write_fixed_varints(kernels.end, rows[:, e_ts:e_tail])
        rows[:, 1] = 1 + ts_width + len(tail_begin)
        rows[:, e_tag + 1] = 1 + ts_width + len(tail_end)
        return rows.reshape(-1)
    keep = np.ones((n, width), dtype=bool)
    begin_len = _write_varints(kernels.start, rows[:, b_ts:b_tail], keep[:, b_ts:b_tail])
    end_len = _write_varints(kernels.end, rows[:, e_ts:e_tail], keep[:, e_ts:e_tail])
    rows[:, 1] = begin_len + (1 + len(tail_begin))
    rows[:, e_tag + 1] = end_len + (1 + len(tail_end))
    return rows[keep]
