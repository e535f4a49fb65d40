"""Perfetto writer: kernel slices are exactly the input kernels, read back the way Perfetto does.

Files are parsed with the generated ``Trace`` proto and replayed like trace processor: interned
names per sequence in file order, then all events sorted by (timestamp, file position) and
BEGIN/END matched per track with a stack.
"""

from __future__ import annotations

import gzip
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    Trace,
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)

from argus_core.processor import perfetto as pf
from argus_core.processor import perfetto_packets as packets
from argus_core.processor.perfetto import (
    GzipWriter,
    TraceWriter,
    WindowTrace,
    build_trace,
    build_trace_gz,
)

T0 = 1_790_000_000_000_000_000  # ns since the epoch, late 2026
WINDOW_NS = 60_000_000_000
CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE


# --- a reader that follows trace processor's rules -------------------------------------------


@dataclass
class Slice:
    track: int
    begin: int
    end: int
    name: str | None
    depth: int
    event: TrackEvent


@dataclass
class Decoded:
    tracks: dict[int, TrackDescriptor]
    slices: list[Slice]
    instants: list[tuple[int, int, str, TrackEvent]]  # track, ts, name, event
    kernel_packets: list[bytes]  # raw Trace.packet payloads that need incremental state


def _packet_payloads(data: bytes) -> list[bytes]:
    """Split a serialized Trace into its packet payloads (field 1, length-delimited)."""
    out, pos = [], 0
    while pos < len(data):
        assert data[pos] == 0x0A, f"unexpected tag {data[pos]:#x} at {pos}"
        pos += 1
        length = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        out.append(data[pos:pos + length])
        pos += length
    return out


def decode(data: bytes) -> Decoded:
    """Tracks, slices and instants of a trace, resolved as trace processor resolves them."""
    trace = Trace.FromString(data)
    payloads = _packet_payloads(data)
    assert len(payloads) == len(trace.packet)
    names: dict[int, dict[int, str]] = defaultdict(dict)  # per sequence
    cleared: set[int] = set()
    tracks: dict[int, TrackDescriptor] = {}
    events, kernel_packets = [], []
    for index, packet in enumerate(trace.packet):
        seq = packet.trusted_packet_sequence_id
        assert seq, "every packet is on a sequence"
        assert not packet.HasField("trace_packet_defaults") and not packet.timestamp_clock_id
        if packet.sequence_flags & CLEARED:
            cleared.add(seq)
            names[seq] = {}
        for entry in packet.interned_data.event_names:
            names[seq][entry.iid] = entry.name
        if packet.HasField("track_descriptor"):
            tracks[packet.track_descriptor.uuid] = packet.track_descriptor
        if not packet.HasField("track_event"):
            continue
        if packet.sequence_flags & NEEDS:
            assert seq in cleared, "incremental state used before it was cleared"
            kernel_packets.append(payloads[index])
        event = packet.track_event
        assert packet.HasField("timestamp") and event.HasField("track_uuid")
        if event.HasField("name_iid"):
            name = names[seq][event.name_iid]
        else:
            name = event.name if event.HasField("name") else None
        events.append((packet.timestamp, index, event.track_uuid, event.type, name, event))
    events.sort(key=lambda e: (e[0], e[1]))  # trace processor's sorter: ts, then file order
    open_slices: dict[int, list] = defaultdict(list)
    slices, instants = [], []
    for ts, _, track, kind, name, event in events:
        assert track in tracks, f"event on undeclared track {track}"
        if kind == TrackEvent.TYPE_SLICE_BEGIN:
            open_slices[track].append((ts, name, event))
        elif kind == TrackEvent.TYPE_SLICE_END:
            begin, begin_name, begin_event = open_slices[track].pop()
            slices.append(Slice(track, begin, ts, begin_name, len(open_slices[track]),
                                begin_event))
        else:
            assert kind == TrackEvent.TYPE_INSTANT
            instants.append((track, ts, name, event))
    assert not any(open_slices.values()), "unterminated slices"
    for uuid, desc in tracks.items():
        assert uuid and (not desc.HasField("parent_uuid") or desc.parent_uuid in tracks)
    return Decoded(tracks, slices, instants, kernel_packets)


def track_named(decoded: Decoded, name: str) -> int:
    """The uuid of the one track with this name."""
    found = [u for u, d in decoded.tracks.items() if d.name == name]
    assert len(found) == 1, (name, found)
    return found[0]


# --- workloads --------------------------------------------------------------------------------

NAMES = ["sm90_xmma_gemm_bf16bf16_bf16f32", "flash_fwd_kernel", "vectorized_elementwise_kernel",
         "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL",
         "layer_norm_fwd", "unused_kernel_name"]


def random_window(seed: int, per_stream: int = 400, streams: tuple[int, ...] = (7, 13, 14, 2),
                  shuffle: bool = True) -> WindowTrace:
    """Kernels on several streams: back-to-back, zero-duration and multi-ms NCCL kernels."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = defaultdict(list)
    for stream in streams:
        nccl = stream == 13
        name = rng.choice([3, 4] if nccl else [0, 1, 2, 5], per_stream)
        dur = np.exp(rng.normal(np.log(8e6 if nccl else 2e4), 1.0, per_stream)).astype(np.int64)
        dur[rng.random(per_stream) < 0.05] = 0  # zero-duration kernels
        gap = np.exp(rng.normal(np.log(5e3), 2.0, per_stream)).astype(np.int64)
        gap[rng.random(per_stream) < 0.1] = 0  # back-to-back kernels
        start = T0 + int(rng.integers(0, 10**6)) + np.cumsum(gap) + np.r_[0, np.cumsum(dur)[:-1]]
        for key, values in (("name", name), ("stream", np.full(per_stream, stream)),
                            ("start", start), ("dur", dur)):
            cols[key].append(values)
    name, stream, start, dur = (np.concatenate(cols[k]) for k in ("name", "stream", "start", "dur"))
    if shuffle:  # completion order across streams, as CUPTI buffers arrive, plus a few swaps
        order = np.argsort(start + dur, kind="stable")
        swaps = rng.integers(0, len(order) - 1, 5)
        order[swaps], order[swaps + 1] = order[swaps + 1], order[swaps].copy()
        name, stream, start, dur = name[order], stream[order], start[order], dur[order]
    steps = [{"step": 100 + i, "t_ns": T0 + i * 400_000_000, "wall_s": 0.4 - 0.01 * (i == 2),
              "gpu_s": 0.37, "phases": {"forward": 0.12, "backward": 0.2, "optimizer": 0.01,
                                        "dp-allreduce": 0.05}} for i in range(5)]
    steps[3]["phases"]["dp-allreduce"] = 0.3  # phases longer than the step: clipped at its end
    stacks = [{"t_ns": T0 + i * 100_000_000, "thread": ["MainThread", "pin_memory"][i % 2],
               "frames": ["train.py:<module>:212", "train.py:main:180",
                          f"torch/_tensor.py:backward:{600 + i % 3}"]} for i in range(7)]
    stacks.append({"t_ns": T0 + 50, "thread": "MainThread", "frames": []})
    return WindowTrace(job="llm", rank=5, window_start_ns=T0, window_ns=WINDOW_NS, host="node-1",
                       names=list(NAMES), kernel_name=name.astype(np.int32), stream=stream,
                       start_ns=start, dur_ns=dur, steps=steps, stacks=stacks)


def kernel_slices(decoded: Decoded, window: WindowTrace) -> list[tuple[int, int, int, str]]:
    """(stream, start, end, name) of every slice on a stream track, sorted."""
    streams = {track_named(decoded, f"stream {s}"): s for s in np.unique(window.stream)}
    streams.update({uuid: int(d.name.split()[1]) for uuid, d in decoded.tracks.items()
                    if "(reordered" in d.name})  # lanes of kernels that arrived late
    found = [(streams[s.track], s.begin, s.end, s.name) for s in decoded.slices
             if s.track in streams]
    assert all(s.depth == 0 for s in decoded.slices if s.track in streams), "kernels nested"
    return sorted(found)


def input_kernels(window: WindowTrace) -> list[tuple[int, int, int, str]]:
    """The window's kernels as (stream, start, end, name), sorted."""
    return sorted(zip(window.stream.tolist(), window.start_ns.tolist(),
                      (window.start_ns + window.dur_ns).tolist(),
                      [window.names[i] for i in window.kernel_name], strict=True))


# --- kernels ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_kernel_slices_are_exactly_the_input_kernels(seed: int):
    window = random_window(seed, shuffle=seed != 0)
    decoded = decode(build_trace(window))
    assert kernel_slices(decoded, window) == input_kernels(window)
    assert len(decoded.kernel_packets) == 2 * len(window.start_ns)


def test_kernel_packets_are_what_protobuf_serializes():
    """Each hand-encoded packet equals the same TracePacket built with the protobuf API."""
    window = random_window(1, per_stream=50)
    data = build_trace(window)
    decoded = decode(data)
    assert len(decoded.kernel_packets) == 2 * len(window.start_ns)
    for payload in decoded.kernel_packets:
        parsed = TracePacket.FromString(payload)
        event = parsed.track_event
        rebuilt = TracePacket(timestamp=parsed.timestamp, trusted_packet_sequence_id=1,
                              sequence_flags=NEEDS)
        rebuilt.track_event.type = event.type
        rebuilt.track_event.track_uuid = event.track_uuid
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            rebuilt.track_event.name_iid = event.name_iid
        else:
            assert event.type == TrackEvent.TYPE_SLICE_END and not event.HasField("name_iid")
        assert rebuilt.SerializeToString() == payload


def test_tracks_and_interned_names():
    window = random_window(2)
    data = build_trace(window)
    decoded = decode(data)
    process = [d for d in decoded.tracks.values() if d.HasField("process")]
    assert len(process) == 1
    assert process[0].process.process_name == "rank 5 (node-1)"
    children = sorted((d.sibling_order_rank, d.name) for d in decoded.tracks.values()
                      if d.parent_uuid == process[0].uuid)
    assert [name for _, name in children] == [
        "steps", "phases (approximate placement)", "stream 2", "stream 7", "stream 13",
        "stream 14", "host stacks"]
    packets = Trace.FromString(data).packet
    assert packets[0].sequence_flags == CLEARED and packets[0].first_packet_on_sequence
    assert all(p.sequence_flags == CLEARED for p in packets if p.HasField("interned_data"))
    interned = {e.name for p in packets for e in p.interned_data.event_names}
    assert interned == set(NAMES) - {"unused_kernel_name"}  # only names the window uses


def test_overlapping_kernels_on_a_stream_are_clipped():
    window = WindowTrace("j", 0, T0, WINDOW_NS, names=["a", "b", "c"],
                         kernel_name=np.array([0, 1, 2, 0], dtype=np.int32),
                         stream=np.array([7, 7, 7, 9]),
                         start_ns=np.array([T0 + 100, T0 + 150, T0 + 160, T0 + 120]),
                         dur_ns=np.array([100, 5, 50, 500]))
    decoded = decode(build_trace(window))
    assert kernel_slices(decoded, window) == [
        (7, T0 + 100, T0 + 150, "a"),  # clipped at the next kernel's start
        (7, T0 + 150, T0 + 155, "b"),
        (7, T0 + 160, T0 + 210, "c"),
        (9, T0 + 120, T0 + 620, "a")]


def test_unsorted_single_stream_and_many_names():
    rng = np.random.default_rng(3)
    n = 3000
    start = T0 + np.arange(n) * 1000
    order = rng.permutation(n)
    names = [f"kernel_{i}" for i in range(400)]  # 300 used: iids need two varint bytes
    window = WindowTrace("j", 1, T0, WINDOW_NS, names=names,
                         kernel_name=rng.integers(100, 400, n).astype(np.int32)[order],
                         stream=np.full(n, 0), start_ns=start[order],
                         dur_ns=rng.integers(0, 1001, n)[order])
    assert kernel_slices(decode(build_trace(window)), window) == input_kernels(window)


def test_small_timestamps_and_varint_edge_deltas():
    """Deltas of 0, 127, 128, 2**32 and 2**63-1 ns, from timestamps near 0."""
    edge = [0, 127, 128, 2**32]
    start = np.cumsum([0, *edge])  # gaps after 0-length kernels hit the edge values
    window = WindowTrace("j", 2, 0, WINDOW_NS, names=["k", "huge"],
                         kernel_name=np.array([0] * 5 + [1], dtype=np.int32),
                         stream=np.array([1] * 5 + [2]),
                         start_ns=np.r_[start, 0], dur_ns=np.r_[edge, 0, 2**63 - 1])
    decoded = decode(build_trace(window))
    assert kernel_slices(decoded, window) == input_kernels(window)
    for payload in decoded.kernel_packets:  # canonical: as long as protobuf would make it
        assert TracePacket.FromString(payload).ByteSize() == len(payload)


# --- writing a window chunk by chunk ---------------------------------------------------------


def write_in_chunks(window: WindowTrace, cuts: list[int], order: list[int] | None = None,
                    ) -> tuple[bytes, TraceWriter]:
    """The window's kernels written as chunks [cuts[i], cuts[i+1]) in ``order``."""
    pieces: list = []
    writer = TraceWriter(pieces.append, job=window.job, rank=window.rank,
                         window_start_ns=window.window_start_ns, window_ns=window.window_ns,
                         host=window.host)
    bounds = [0, *cuts, len(window.start_ns)]
    for i in order if order is not None else range(len(bounds) - 1):
        part = slice(bounds[i], bounds[i + 1])
        writer.add_kernels(window.names, window.kernel_name[part], window.stream[part],
                           window.start_ns[part], window.dur_ns[part])
    writer.finish(window.names, window.steps, window.stacks)
    return b"".join(bytes(memoryview(p)) for p in pieces), writer


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3), st.lists(st.integers(0, 1600), max_size=12))
def test_chunked_writing_gives_the_one_shot_slices(seed: int, cuts: list[int]):
    """However the batches are cut, the slices are those of the window written at once."""
    window = random_window(seed, shuffle=True)
    data, writer = write_in_chunks(window, sorted(set(cuts)))
    decoded = decode(data)
    assert kernel_slices(decoded, window) == kernel_slices(decode(build_trace(window)), window)
    assert kernel_slices(decoded, window) == input_kernels(window)
    assert writer.reordered == 0 and writer.kernels == len(window.start_ns)


def test_overlaps_across_chunk_boundaries_are_clipped_as_in_one_shot():
    window = WindowTrace("j", 0, T0, WINDOW_NS, names=["a", "b", "c"],
                         kernel_name=np.array([0, 1, 2, 0], dtype=np.int32),
                         stream=np.array([7, 7, 7, 9]),
                         start_ns=np.array([T0 + 100, T0 + 150, T0 + 160, T0 + 120]),
                         dur_ns=np.array([100, 5, 50, 500]))
    for cuts in ([1], [1, 2], [1, 2, 3]):
        data, _ = write_in_chunks(window, cuts)
        assert kernel_slices(decode(data), window) == kernel_slices(
            decode(build_trace(window)), window)


def test_batches_arriving_out_of_order_lose_nothing_and_never_overlap():
    """A batch older than what was already written goes to a "reordered" lane of its stream."""
    window = random_window(5, shuffle=False)
    order = np.argsort(window.start_ns, kind="stable")
    for column in ("kernel_name", "stream", "start_ns", "dur_ns"):
        setattr(window, column, getattr(window, column)[order])
    n = len(window.start_ns)
    cuts = [n * k // 6 for k in range(1, 6)]
    data, writer = write_in_chunks(window, cuts, order=[0, 2, 1, 3, 5, 4])
    decoded = decode(data)
    assert kernel_slices(decoded, window) == input_kernels(window)  # depth 0, all there
    lanes = [d.name for d in decoded.tracks.values() if "(reordered" in d.name]
    assert lanes and writer.reordered > 0 and writer.kernels == n


def test_gzip_writer_sync_leaves_a_readable_prefix(tmp_path: Path):
    """After sync() the file decompresses to everything written so far (crash safety)."""
    import zlib

    window = random_window(6)
    path = tmp_path / "w.pftrace.gz"
    with open(path, "wb") as fh:
        gz = GzipWriter(fh)
        writer = TraceWriter(gz.write, job="j", rank=1, window_start_ns=T0,
                             window_ns=WINDOW_NS)
        half = len(window.start_ns) // 2
        writer.add_kernels(window.names, window.kernel_name[:half], window.stream[:half],
                           window.start_ns[:half], window.dur_ns[:half])
        gz.sync()
        fh.flush()
        prefix = zlib.decompressobj(31).decompress(path.read_bytes())
        assert len(Trace.FromString(prefix).packet) > half  # whole packets, no trailer yet
        writer.finish(window.names)
        gz.close()
    assert Trace.FromString(gzip.decompress(path.read_bytes())).packet


# --- varints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**63 - 1, 2**64 - 1])
def test_varint_matches_protobuf(value: int):
    reference = TracePacket(timestamp=value).SerializeToString()
    assert reference[0] == 8 << 3  # TracePacket.timestamp: field 8, varint
    assert packets.encode_varints([value]) == [reference[1:]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40))
def test_varints_match_protobuf_for_any_values(values: list[int]):
    expected = [TracePacket(timestamp=v).SerializeToString()[1:] for v in values]
    assert packets.encode_varints(values) == expected


def test_field_numbers_come_from_the_descriptors():
    fields = TracePacket.DESCRIPTOR.fields_by_name
    assert [fields[n].number for n in ("timestamp", "trusted_packet_sequence_id", "track_event",
                                       "sequence_flags", "interned_data")] == [8, 10, 11, 13, 12]
    event = TrackEvent.DESCRIPTOR.fields_by_name
    assert [event[n].number for n in ("type", "name_iid", "track_uuid")] == [9, 10, 11]
    assert (packets._T_TIMESTAMP, packets._T_SEQUENCE_ID, packets._T_TRACK_EVENT,
            packets._T_SEQUENCE_FLAGS) == (
        8 << 3, 10 << 3, 11 << 3 | 2, 13 << 3)
    assert (packets._T_TYPE, packets._T_NAME_IID, packets._T_TRACK_UUID,
            packets._T_PACKET) == (
        9 << 3, 10 << 3, 11 << 3, 1 << 3 | 2)


# --- steps, phases, stacks ----------------------------------------------------------------------


def test_steps_phases_and_stacks():
    window = random_window(4)
    decoded = decode(build_trace(window))
    steps = sorted((s.begin, s.end, s.name) for s in decoded.slices
                   if s.track == track_named(decoded, "steps"))
    expected = []
    for i, step in enumerate(window.steps):
        end = step["t_ns"] + round(step["wall_s"] * 1e9)
        if i + 1 < len(window.steps):
            end = min(end, window.steps[i + 1]["t_ns"])
        expected.append((step["t_ns"], end, f"step {step['step']}"))
    assert steps == expected

    phase_track = track_named(decoded, "phases (approximate placement)")
    by_step = defaultdict(list)
    for s in sorted((s for s in decoded.slices if s.track == phase_track),
                    key=lambda s: (s.begin, s.end)):
        notes = {a.name: a for a in s.event.debug_annotations}
        by_step[notes["step"].int_value].append((s.name, s.begin, s.end,
                                                 notes["measured_s"].double_value))
    assert all(s.depth == 0 for s in decoded.slices)  # nothing nests on any track
    for step, (begin, end, _) in zip(window.steps, expected, strict=True):
        cursor, want = begin, []
        for name, seconds in step["phases"].items():  # back to back, clipped at the step's end
            want.append((name, cursor, min(cursor + round(seconds * 1e9), end), seconds))
            cursor = want[-1][2]
        assert by_step[step["step"]] == want
    assert by_step[103][-1][1:3] == (T0 + 1_530_000_000, T0 + 1_600_000_000)  # clipped

    assert not any(n.startswith("with_rank_") for s in decoded.slices
                   for n in (a.name for a in s.event.debug_annotations))

    stacks_parent = track_named(decoded, "host stacks")
    threads = {decoded.tracks[u].name: u for u in decoded.tracks
               if decoded.tracks[u].parent_uuid == stacks_parent}
    assert set(threads) == {"MainThread", "pin_memory"}
    got = sorted((ts, track, name) for track, ts, name, _ in decoded.instants)
    want = sorted((s["t_ns"], threads[s["thread"]], s["frames"][-1] if s["frames"]
                   else "(empty stack)") for s in window.stacks)
    assert got == want
    sample = next(e for _, ts, _, e in decoded.instants if ts == T0 + 100_000_000)
    stack = {a.name: a for a in sample.debug_annotations}["stack"]
    assert [v.string_value for v in stack.array_values] == window.stacks[1]["frames"]
    assert [(f.source_file, f.function_name, f.line_number) for f in sample.callstack.frames] == [
        ("train.py", "<module>", 212), ("train.py", "main", 180),
        ("torch/_tensor.py", "backward", 601)]


@pytest.mark.parametrize("bad", [
    pytest.param({"wall_s": 1e300}, id="wall-1e300"),  # round(1e309) overflows
    pytest.param({"t_ns": 2**64 - 10}, id="t-ns-near-2-pow-64"),  # beyond protobuf's uint64
])
def test_one_unencodable_step_loses_nothing_else(bad):
    """A step the writer cannot encode is left out and counted; the window's kernels, its
    other steps and its stack samples are all still written (the whole file used to be lost)."""
    window = random_window(6)
    window.steps[2] = {**window.steps[2], **bad}
    writer_out: list = []
    writer = TraceWriter(writer_out.append, job="llm", rank=5, window_start_ns=T0,
                         window_ns=WINDOW_NS, host="node-1")
    writer.add_kernels(window.names, window.kernel_name, window.stream, window.start_ns,
                       window.dur_ns)
    writer.add_stacks(window.stacks[:3])  # samples are written as they come
    writer.finish(window.names, window.steps, window.stacks[3:])
    decoded = decode(b"".join(memoryview(c) for c in writer_out))
    assert writer.skipped == 1
    assert kernel_slices(decoded, window) == input_kernels(window)
    steps = {s.name for s in decoded.slices if s.track == track_named(decoded, "steps")}
    assert steps == {f"step {s['step']}" for i, s in enumerate(window.steps) if i != 2}
    assert len(decoded.instants) == len(window.stacks)



def test_a_point_to_point_phase_carries_its_time_per_peer():
    """A step's ``peers`` (a pipeline stage's sends and recvs per neighbour) are on its
    phase's slice as ``with_rank_N_s``: what a reader of the trace needs to see which link
    a send waited on."""
    window = random_window(4)
    window.steps[1]["phases"]["pp-send"] = 0.02
    window.steps[1]["peers"] = {"pp-send": {"6": {"s": 0.015, "n": 3, "min_s": 0.004},
                                            "4": {"s": 0.005, "n": 1, "min_s": 0.005}}}
    decoded = decode(build_trace(window))
    send = [s for s in decoded.slices if s.name == "pp-send"]
    assert len(send) == 1
    notes = {a.name: a.double_value for a in send[0].event.debug_annotations
             if a.name.startswith("with_rank_")}
    assert notes == {"with_rank_6_s": 0.015, "with_rank_4_s": 0.005}

def test_parsed_records_work_like_dicts():
    from argus_core.schema import StackRecord, StepRecord

    window = random_window(5, per_stream=10)
    as_records = WindowTrace(**{**window.__dict__,
                                "steps": [StepRecord("llm", 5, **s) for s in window.steps],
                                "stacks": [StackRecord("llm", 5, **s) for s in window.stacks]})
    assert build_trace(as_records) == build_trace(window)


# --- containers ---------------------------------------------------------------------------------


def test_empty_window_is_a_valid_trace():
    window = WindowTrace("j", 0, T0, WINDOW_NS)
    data = build_trace(window)
    decoded = decode(data)
    assert decoded.slices == [] and decoded.instants == []
    assert [d.process.process_name for d in decoded.tracks.values() if d.HasField("process")] \
        == ["rank 0"]
    assert gzip.decompress(build_trace_gz(window)) == data
    with_steps = WindowTrace("j", 0, T0, WINDOW_NS, steps=random_window(0).steps)
    assert len(decode(build_trace(with_steps)).slices) == 5 * 5


@pytest.mark.parametrize("backend", ["zlib", "isal"])
def test_gzip_decompresses_to_the_trace(backend: str):
    if backend == "isal" and pf._isal_zlib is None:
        pytest.skip("the optional isal package is not installed")
    window = random_window(6)
    gz = build_trace_gz(window, backend=backend)
    assert gz[:2] == b"\x1f\x8b"
    assert gzip.decompress(gz) == build_trace(window)
    assert gzip.decompress(build_trace_gz(window)) == build_trace(window)  # default backend


def test_unknown_backend_and_bad_columns_are_rejected():
    with pytest.raises(ValueError, match="backend"):
        build_trace_gz(WindowTrace("j", 0, T0, WINDOW_NS), backend="brotli")
    bad = WindowTrace("j", 0, T0, WINDOW_NS, names=["a"], kernel_name=np.array([1], np.int32),
                      stream=np.array([0]), start_ns=np.array([T0]), dur_ns=np.array([1]))
    with pytest.raises(ValueError, match="name index"):
        build_trace(bad)


# --- trace processor, when one is available offline -------------------------------------------


def _offline_trace_processor() -> str | None:
    """A trace_processor_shell that needs no download: env var, PATH, or the package's cache."""
    explicit = os.environ.get("ARGUS_TRACE_PROCESSOR")
    if explicit:
        return explicit
    for name in ("trace_processor_shell", "trace_processor"):
        if found := shutil.which(name):
            return found
    try:  # the prebuilt the perfetto package would download, if an earlier run cached it
        import platform
        import sys

        from perfetto.prebuilts.manifests.trace_processor_shell import (
            TRACE_PROCESSOR_SHELL_MANIFEST,
        )
    except ImportError:
        return None
    for entry in TRACE_PROCESSOR_SHELL_MANIFEST:
        if entry.get("platform") == sys.platform and \
                platform.machine().lower() in entry.get("machine", []):
            root, ext = os.path.splitext(entry["file_name"])
            cached = Path.home() / ".local/share/perfetto/prebuilts" / \
                f"{root}-{entry['sha256'][:16]}{ext}"
            return str(cached) if cached.is_file() else None
    return None


def test_trace_processor_counts_the_slices(tmp_path: Path):
    binary = _offline_trace_processor()
    if binary is None:
        pytest.skip("no trace_processor_shell available offline: the perfetto package downloads "
                    "it on first use and this machine has no network (set "
                    "ARGUS_TRACE_PROCESSOR to a local binary to run this check)")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    window = random_window(7)
    path = tmp_path / "window.pftrace"
    path.write_bytes(build_trace(window))
    decoded = decode(path.read_bytes())
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=binary))
    try:
        total = tp.query("select count(*) as n from slice").as_pandas_dataframe()["n"][0]
        kernels = tp.query("select count(*) as n from slice join track on slice.track_id = "
                           "track.id where track.name like 'stream %'").as_pandas_dataframe()
    finally:
        tp.close()
    assert total == len(decoded.slices) + len(decoded.instants)
    assert kernels["n"][0] == len(window.start_ns)
