"""Processor intake: body decoding, per-record validation, and windows on record time."""

from __future__ import annotations

import gzip
import json

import numpy as np
import orjson
import pytest
from backports import zstd
from hypothesis import given, settings
from hypothesis import strategies as st

from argus_core.processor.ingest import MAX_MEMBERS, BodyError, decode_body, parse_body
from argus_core.processor.windows import WindowStore
from argus_core.schema import parse_record

W = 60_000_000_000  # 60 s


def kernels(rank=0, start=0, n=5, job="j"):
    return {"v": 1, "kind": "kernels", "job": job, "rank": rank, "names": ["gemm", "nccl"],
            "name": [i % 2 for i in range(n)], "stream": [7] * n,
            "start_ns": [start + i * 1000 for i in range(n)], "dur_ns": [500] * n}


def ndjson(*records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


@pytest.mark.parametrize("encoding, compress", [
    ("gzip", gzip.compress), ("zstd", zstd.compress),
    ("", lambda b: b), ("", gzip.compress),  # unlabelled gzip is sniffed
])
def test_bodies_decode(encoding, compress):
    """gzip, zstd and plain bodies decode to the same bytes."""
    body = ndjson(kernels())
    assert decode_body(compress(body), encoding, 1 << 20) == body


def test_multi_member_gzip_is_read_whole():
    """Concatenated gzip members are one valid gzip body: every member's records count."""
    first, second = ndjson(kernels()), ndjson(kernels(start=W))
    body = gzip.compress(first) + gzip.compress(second)
    assert decode_body(body, "gzip", 1 << 20) == first + second
    with pytest.raises(BodyError) as exc:  # the cap holds across members
        decode_body(body, "gzip", len(first) + 10)
    assert exc.value.status == 413


def test_multi_frame_zstd_is_read_whole():
    """A zstd stream of several frames (and a skippable frame) is read whole, not just its
    first frame (which used to be answered 200 with the later frames silently dropped)."""
    first, second = ndjson(kernels()), ndjson(kernels(start=W))
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"skip"
    body = zstd.compress(first) + skippable + zstd.compress(second)
    assert decode_body(body, "zstd", 1 << 20) == first + second
    assert len(parse_body(decode_body(body, "", 1 << 20)).records) == 2  # sniffed too
    with pytest.raises(BodyError) as exc:  # the cap holds across frames
        decode_body(body, "zstd", len(first) + 10)
    assert exc.value.status == 413
    with pytest.raises(BodyError) as exc:  # a frame cut short in transit
        decode_body(body[:-3], "zstd", 1 << 20)
    assert exc.value.status == 400


@pytest.mark.parametrize("encoding, empty", [("gzip", gzip.compress(b"")),
                                             ("zstd", zstd.compress(b""))], ids=["gzip", "zstd"])
def test_bodies_of_too_many_members_are_refused(encoding, empty):
    """200,000 empty gzip members (4 MB) used to pin the service for 13 s: past the member cap
    the body is refused with a 413 that names the cap; up to it, every member is read."""
    good = ndjson(kernels())
    compress = gzip.compress if encoding == "gzip" else zstd.compress
    assert decode_body(empty * 999 + compress(good), encoding, 1 << 20, max_members=1000) == good
    with pytest.raises(BodyError) as exc:
        decode_body(empty * 1000 + compress(good), encoding, 1 << 20, max_members=1000)
    assert exc.value.status == 413 and "more than 1000" in exc.value.message
    with pytest.raises(BodyError) as exc:  # the default cap
        decode_body(empty * 200_000, encoding, 1 << 20)
    assert exc.value.status == 413 and f"more than {MAX_MEMBERS}" in exc.value.message


def test_decompression_bomb_is_refused():
    """A small gzip body that inflates past the limit is a 413, without inflating it all."""
    bomb = gzip.compress(b"\n" * (50 << 20))
    with pytest.raises(BodyError) as exc:
        decode_body(bomb, "gzip", 1 << 20)
    assert exc.value.status == 413


@pytest.mark.parametrize("body, encoding, status", [
    (b"not gzip", "gzip", 400), (b"x", "br", 415), (b"x" * 100, "", 413),
    (gzip.compress(b'{"v": 1}\n' * 4)[:-12], "gzip", 400),  # truncated in transit
])
def test_bad_bodies(body, encoding, status):
    """Corrupt or unsupported encodings and oversized bodies get the right status."""
    with pytest.raises(BodyError) as exc:
        decode_body(body, encoding, 50)
    assert exc.value.status == status


def test_ndjson_and_json_array_are_both_accepted():
    """Vector's newline-delimited and array framings carry the same records."""
    records = [kernels(0), kernels(1)]
    a = parse_body(ndjson(*records))
    b = parse_body(orjson.dumps(records))
    assert len(a.records) == len(b.records) == 2 and a.rejected == b.rejected == 0


def test_bad_records_are_named_and_the_rest_kept():
    """Malformed JSON, unknown kind and negative durations: errors name line and field."""
    bad = kernels()
    bad["dur_ns"][2] = -1
    body = ndjson(kernels()) + b"{oops\n" + ndjson({"v": 1, "kind": "nope", "job": "j",
                                                    "rank": 0}, bad, kernels(1))
    result = parse_body(body)
    assert len(result.records) == 2
    assert result.rejected == 3
    assert result.errors[0].startswith("line 2: json")
    assert result.errors[1].startswith("line 3: kind")
    assert result.errors[2].startswith("line 4: dur_ns[2]")
    assert parse_body(b'[{"v": 1}, ' + orjson.dumps(kernels()) + b"]").errors[0].startswith(
        "item 1: kind")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(blob):
    """Fuzz: any body yields accepted records plus named rejects, never an exception."""
    result = parse_body(blob)
    assert result.rejected + len(result.records) >= 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 2**64), st.floats(allow_nan=True), st.text(max_size=3),
                          st.booleans(), st.none()), min_size=1, max_size=6))
def test_fuzzed_kernel_columns_are_rejected_or_exact(values):
    """Any value in dur_ns: the record is either rejected with a named field or kept exactly."""
    rec = kernels(n=len(values))
    rec["dur_ns"] = values
    result = parse_body(json.dumps(rec).encode())  # stdlib json: writes NaN and huge ints
    if result.records:
        assert result.records[0].dur_ns.tolist() == [int(v) for v in values]
    else:
        assert result.errors[0].split(": ")[1] in ("json", "dur_ns") or "dur_ns[" in \
            result.errors[0]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["name", "stream", "start_ns", "dur_ns"]),
       st.lists(st.one_of(st.integers(-5, 2**64),
                          st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                          st.text(max_size=3)), min_size=1, max_size=6),
       st.sampled_from(["gemm", "true_kernel", "falsey"]), st.booleans())
def test_the_body_path_judges_kernel_columns_as_strictly_as_the_schema(column, values, name,
                                                                       as_array):
    """The processor skips the per-value type check when a line has no ``true``/``false``
    token: a bool (never accepted as 0 or 1), float, string or out-of-range value in any column
    is still refused naming it, exactly as ``parse_record`` refuses it, and a valid record
    whose kernel name merely contains the word is kept exactly."""
    rec = kernels(n=len(values))
    rec["names"] = [name, "nccl"]
    rec[column] = values
    text = json.dumps([rec] if as_array else rec)  # stdlib json: writes huge ints
    result = parse_body(text.encode() + b"\n")
    try:
        strict = parse_record(json.loads(text)[0] if as_array else json.loads(text))
    except Exception as exc:  # SchemaError: the body path names the same field
        assert not result.records and exc.field in result.errors[0], (result.errors, exc)
        return
    assert len(result.records) == 1
    got = result.records[0]
    for field in ("name", "stream", "start_ns", "dur_ns"):
        assert getattr(got, field).tolist() == getattr(strict, field).tolist()
        assert getattr(got, field).dtype == getattr(strict, field).dtype


def test_kernel_batch_split_across_windows():
    """A batch straddling a window edge is split by kernel start time."""
    store = WindowStore(60, 10)
    store.add(parse_record(kernels(start=W - 2500, n=5)))  # 3 before the edge, 2 after
    assert sorted(w.events for w in store.open.values()) == [2, 3]
    assert store.buffered_events == 5


def test_windows_close_on_watermark_and_late_records_are_counted():
    """A window closes once records pass its end + grace; later records for it are late."""
    store = WindowStore(60, 10)
    store.add(parse_record(kernels(start=5 * W + 1)))
    assert store.due(now=0) == []
    store.add(parse_record(kernels(start=6 * W + 11_000_000_000)))  # past end + grace
    closed = store.due(now=0)
    assert [(h.window.start_ns, len(h.kernels)) for h in closed] == [(5 * W, 5)]
    assert store.add(parse_record(kernels(start=5 * W + 7))) == 5
    assert store.late == {"kernels": 5} and store.buffered_events == 5


def test_the_watermark_never_runs_ahead_of_the_clock():
    """A record stamped ahead of the processor's clock moves the watermark only to the clock
    plus the grace period: windows the rank is still filling stay open."""
    now = 100 * W + 30 * 10**9
    store = WindowStore(60, 10, clock_ns=lambda: now)
    store.add(parse_record(kernels(start=now - 20 * 10**9)))  # the current window
    store.add(parse_record(kernels(start=now + 30 * W)))  # half an hour ahead
    assert [h.window.index for h in store.due(now=0)] == []
    assert store.add(parse_record(kernels(start=now - 10 * 10**9))) == 0


def test_idle_windows_close_in_wall_time():
    """A rank that stops sending still gets its window closed after window + grace seconds."""
    store = WindowStore(60, 10)
    store.add(parse_record(kernels(start=W)))
    assert store.due(now=10**9) and not store.open


def test_a_window_kept_busy_closes_at_its_lifetime():
    """A window that keeps getting records (a rank whose clock stands still) still closes
    after its lifetime, so nothing it holds stays in memory or in the log for ever."""
    store = WindowStore(60, 10, max_lifetime_s=140)
    store.add(parse_record(kernels(start=W)))
    window = next(iter(store.open.values()))
    window.touched = window.created + 130  # records kept coming
    assert store.due(now=window.created + 139) == []
    assert [h.window for h in store.due(now=window.created + 141)] == [window]


def test_closed_window_carries_identity_steps_and_stacks():
    """Steps, stack samples and the rank's host come out with the window's kernels."""
    store = WindowStore(60, 10)
    store.add(parse_record({"v": 1, "kind": "rank", "job": "j", "rank": 0, "world_size": 2,
                            "host": "node-9"}))
    store.add(parse_record(kernels(start=W + 1)))
    store.add(parse_record({"v": 1, "kind": "step", "job": "j", "rank": 0, "step": 3,
                            "t_ns": W + 5, "wall_s": 0.4, "gpu_s": 0.3, "phases": {"mlp": 0.1}}))
    store.add(parse_record({"v": 1, "kind": "stack", "job": "j", "rank": 0, "t_ns": W + 9,
                            "thread": "MainThread", "frames": ["a.py:f:1"]}))
    (handover,) = store.close_all()
    window = handover.window
    assert store.host("j", 0) == "node-9" and len(window.steps) == 1
    assert len(handover.stacks) == 1
    assert window.names.names[handover.kernels.name[0]] == "gemm"
    np.testing.assert_array_equal(handover.kernels.start_ns, [W + 1 + i * 1000 for i in range(5)])
    assert store.memory() == {"kernels": 0, "records": 0, "windows": 0,
                              "ranks": store.rank_bytes, "floors": 0}


def test_kernels_are_handed_over_in_chunks_and_the_rest_at_close():
    """A window gives up its kernels once it holds a chunk's worth; close hands the rest."""
    store = WindowStore(60, 10)
    store.add(parse_record(kernels(start=W + 1, n=5)))
    assert store.chunks(min_events=8, min_bytes=1 << 20) == []
    store.add(parse_record(kernels(start=W + 10_000, n=5)))
    (handover,) = store.chunks(min_events=8, min_bytes=1 << 20)
    window = handover.window
    assert len(handover.kernels) == 10 and window.held == 0 and store.buffered_events == 0
    store.add(parse_record(kernels(start=W + 20_000, n=3)))
    assert store.buffered_events == 3 and store.chunks(min_events=8, min_bytes=1 << 20) == []
    (closed,) = store.close_all()
    assert closed.window is window and len(closed.kernels) == 3 and window.events == 13
    assert store.buffered_events == 0


def test_stack_samples_are_handed_over_by_bytes():
    """Stack samples leave a window once they hold ``min_bytes``: they never pile up until
    it closes."""
    store = WindowStore(60, 10)
    sample = {"v": 1, "kind": "stack", "job": "j", "rank": 0, "thread": "MainThread",
              "frames": ["a.py:f:1"] * 20}
    for i in range(5):
        store.add(parse_record({**sample, "t_ns": W + i}))
    held = store.memory()["records"]
    assert held > 0 and store.chunks(min_events=10**6, min_bytes=held + 1) == []
    (handover,) = store.chunks(min_events=10**6, min_bytes=held)
    assert len(handover.stacks) == 5 and handover.bytes == held
    assert store.memory()["records"] == 0


def test_rank_state_survives_a_snapshot():
    """Identities, watermarks and closed windows round-trip through the log's snapshot."""
    store = WindowStore(60, 10)
    store.add(parse_record({"v": 1, "kind": "rank", "job": "j", "rank": 3, "world_size": 8,
                            "host": "node-3", "coords": {"dp": 1, "tp": 2}}))
    store.add(parse_record(kernels(rank=3, start=W + 1)))
    store.close_all()
    again = WindowStore(60, 10)
    again.restore(orjson.loads(orjson.dumps(store.snapshot())))
    assert again.identities() == store.identities()
    assert again.add(parse_record(kernels(rank=3, start=W + 5))) == 5  # still closed
