"""Trace storage: keys, file and S3 stores, the spooling uploader, and ``argus traces``.

S3 is a real moto server on loopback, started once per session; tests that need an outage stop
it and start it again on the same port (moto keeps state in memory, so buckets are recreated).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import free_port

from argus_core.cli import traces as traces_cli
from argus_core.processor.store import (
    FileStore,
    NotFoundError,
    S3Store,
    StoreError,
    TraceRef,
    Uploader,
    UploadStats,
    find_traces,
    iter_spool_keys,
    job_prefix,
    open_store,
    parse_key,
    safe_job,
    trace_key,
    window_label,
)

T0 = 1_795_003_200_000_000_000  # 2026-11-18T12:00:00Z, a whole minute
MINUTE = 60_000_000_000
FAST = {"backoff_s": 0.02, "max_backoff_s": 0.2}  # keep retry loops fast in tests


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(("job", "expected"), [
    ("../x", "%2E.%2Fx"),
    ("a/b", "a%2Fb"),
    ("ジョブ", "%E3%82%B8%E3%83%A7%E3%83%96"),
    ("..", "%2E."),
    (".hidden", "%2Ehidden"),
    ("a..b", "a.%2Eb"),
    ("50% a~b\n\x00", "50%25%20a%7Eb%0A%00"),
    ("llama-70b_run.3", "llama-70b_run.3"),
])
def test_safe_job_examples(job, expected):
    """The documented rule on path tricks, unicode, control characters and plain names."""
    assert safe_job(job) == expected


def _assert_safe_segment(segment: str) -> None:
    assert segment and segment.isascii()
    assert "/" not in segment and "\\" not in segment and ".." not in segment
    assert not segment.startswith(".")
    assert all(ch.isprintable() and ch != " " for ch in segment)
    assert len(segment) <= 128


@settings(max_examples=200, deadline=None)
@given(job=st.text(min_size=1, max_size=60), rank=st.integers(0, 100_000),
       start=st.integers(0, 4_000_000_000 * 10**9))
def test_keys_are_safe_and_round_trip(job, rank, start):
    """Any job name gives a safe segment, and parse_key inverts trace_key exactly."""
    segment = safe_job(job)
    _assert_safe_segment(segment)
    key = trace_key("argus/traces", job, rank, start)
    assert key == f"argus/traces/{segment}/rank={rank}/{window_label(start)}.pftrace.gz"
    reported = segment if "~" in segment else job  # cut names report their segment
    assert parse_key(key) == TraceRef(job=reported, rank=rank, window_start_ns=start, key=key)


def test_long_job_names_are_cut_with_a_hash():
    """Very long names keep keys short and stay distinct; parse_key reports the segment."""
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    seg_a, seg_b = safe_job(a), safe_job(b)
    _assert_safe_segment(seg_a)
    assert seg_a != seg_b and "~" in seg_a
    unicode_seg = safe_job("é" * 200)
    _assert_safe_segment(unicode_seg)
    assert unicode_seg.split("~")[0].endswith("%A9")  # never a split %XX escape
    ref = parse_key(trace_key("", a, 0, T0))
    assert ref is not None and ref.job == seg_a


def test_window_label_is_readable_and_sorts_by_time():
    """Whole seconds read as compact UTC; keys sort in time order; fractions round-trip."""
    assert window_label(T0) == "20261118T120000Z"
    assert trace_key("p/", "j", 3, T0) == "p/j/rank=3/20261118T120000Z.pftrace.gz"
    assert trace_key("", "j", 3, T0) == "j/rank=3/20261118T120000Z.pftrace.gz"
    starts = [0, T0 - MINUTE, T0, T0 + 59 * MINUTE, T0 + 10**6 * MINUTE]
    keys = [trace_key("p", "j", 0, s) for s in starts]
    assert keys == sorted(keys)
    odd = T0 + 250_000_000
    assert window_label(odd) == "20261118T120000.250000000Z"
    assert parse_key(trace_key("p", "j", 0, odd)).window_start_ns == odd


@pytest.mark.parametrize("key", [
    "", "j", "j/rank=1", "p/j/rank=1/20261118T120000Z.pftrace",
    "p/j/rank=01/20261118T120000Z.pftrace.gz", "p/j/rank=-1/20261118T120000Z.pftrace.gz",
    "p/j/rank=x/20261118T120000Z.pftrace.gz", "p/a b/rank=1/20261118T120000Z.pftrace.gz",
    "p/a%2fb/rank=1/20261118T120000Z.pftrace.gz",  # not the canonical (upper-case) form
    "p/j/rank=1/20261318T120000Z.pftrace.gz", "p/j/rank=1/20261118T120000.5Z.pftrace.gz",
    "p/j/rank=1/.tmp-20261118T120000Z.pftrace.gz",
])
def test_parse_key_rejects_other_keys(key):
    """Keys that trace_key never produces are not trace keys."""
    assert parse_key(key) is None


@pytest.mark.parametrize("bad", [
    lambda: safe_job(""),
    lambda: trace_key("p", "j", -1, T0),
    lambda: trace_key("p", "j", True, T0),
    lambda: trace_key("p", "j", 0, -1),
    lambda: trace_key("p", "j", 0, 10**30),
])
def test_key_arguments_are_checked(bad):
    """Empty jobs, negative ranks and starts outside years 1970-9999 are refused."""
    with pytest.raises(ValueError):
        bad()


# --------------------------------------------------------------------------- stores


@pytest.mark.parametrize("url", [
    "ftp://host/x", "/var/lib/argus", "relative/dir", "s3://", "s3:///prefix",
    "file://host/dir", "http://127.0.0.1:9000/bucket",
])
def test_open_store_refuses_other_urls(url):
    """Anything but file:///dir and s3://bucket[/prefix] is a clear ValueError."""
    with pytest.raises(ValueError, match="store URL"):
        open_store(url)


def test_open_store_parses_urls(tmp_path, s3_env):
    """file:///dir is a directory with no prefix; s3://bucket/a/b/ has the prefix a/b."""
    local = open_store(tmp_path.as_uri())
    assert isinstance(local, FileStore) and local.root == tmp_path and local.prefix == ""
    remote = open_store("s3://bucket-x/a/b/")
    assert isinstance(remote, S3Store)
    assert (remote.bucket, remote.prefix, remote.url) == ("bucket-x", "a/b", "s3://bucket-x/a/b")
    assert open_store("s3://bucket-x").prefix == ""


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    """Each store kind, empty: a directory, and a fresh bucket on moto with a prefix."""
    if request.param == "file":
        return open_store((tmp_path / "store").as_uri())
    return open_store(request.getfixturevalue("s3").url("traces/v1"))


def test_store_put_list_get(store):
    """Objects come back byte for byte; listing filters by prefix and start_after, by key."""
    keys = [trace_key(store.prefix, job, rank, T0 + w * MINUTE)
            for job in ("a/b", "ab") for rank in (0, 10) for w in range(3)]
    for i, key in enumerate(keys):
        store.put(key, bytes([i]) * (i + 1))
    store.put(keys[0], b"replaced")
    listed = store.list(store.prefix)
    assert [info.key for info in listed] == sorted(keys)
    sizes = {info.key: info.size for info in listed}
    assert sizes[keys[0]] == len(b"replaced") and sizes[keys[5]] == 6
    assert all(info.last_modified.tzinfo is not None for info in listed)
    assert store.get(keys[0]) == b"replaced"
    assert store.get(keys[4]) == bytes([4]) * 5
    job_a = [info.key for info in store.list(job_prefix(store.prefix, "a/b", 10))]
    assert job_a == sorted(keys[3:6])
    after = store.list(keys[3].rsplit("/", 1)[0] + "/", start_after=keys[3])
    assert [info.key for info in after] == sorted(keys[4:6])
    assert store.list("nothing/here/") == []
    with pytest.raises(NotFoundError):
        store.get(trace_key(store.prefix, "a/b", 99, T0))


def test_file_store_is_atomic_and_confined(tmp_path):
    """No temporary files are left or listed, and keys cannot leave the root."""
    store = FileStore(tmp_path)
    store.put("j/rank=0/x.pftrace.gz", b"data")
    (tmp_path / "j" / "rank=0" / ".tmp-partial").write_bytes(b"half")
    assert [p.name for p in (tmp_path / "j" / "rank=0").iterdir() if p.name != ".tmp-partial"] \
        == ["x.pftrace.gz"]
    assert [info.key for info in store.list()] == ["j/rank=0/x.pftrace.gz"]
    for bad in ("../escape", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError):
            store.put(bad, b"x")


def test_s3_store_errors_are_store_errors(s3_no_bucket, monkeypatch):
    """A missing bucket and an unreachable endpoint raise StoreError with a useful message."""
    store = open_store(s3_no_bucket.url())
    with pytest.raises(StoreError, match="does not exist"):
        store.put("argus/x", b"x")
    with pytest.raises(StoreError, match="does not exist"):
        store.list("argus/")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(StoreError, match="endpoint"):
        open_store(s3_no_bucket.url()).list("argus/")
    assert time.monotonic() - start < 5


# --------------------------------------------------------------------------- uploader


def _payloads(prefix: str, count: int, size: int = 1000, job: str = "job/1") -> dict[str, bytes]:
    """Distinct trace files (key -> bytes) of rank 0..count-1 in one window."""
    return {trace_key(prefix, job, rank, T0): os.urandom(size) for rank in range(count)}


def _spool_files(spool: Path) -> list[str]:
    return sorted(p.name for p in spool.iterdir() if p.name != ".lock")


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_uploader_delivers_to_s3(s3, tmp_path):
    """Submitted files arrive in S3 with their keys and bytes; the spool empties."""
    store = open_store(s3.url())
    files = _payloads(store.prefix, 5)
    spool = tmp_path / "spool"
    with Uploader(store, spool, 1 << 20, **FAST) as uploader:
        for key, data in files.items():
            uploader.submit(key, data)
        assert uploader.flush(10)
        assert (uploader.pending, uploader.spool_bytes) == (0, 0)
        assert uploader.stats.snapshot() == {
            "uploaded_files": 5, "uploaded_bytes": 5000, "failures": 0, "dropped_files": 0,
            "dropped_bytes": 0}
    assert s3.objects() == files
    assert _spool_files(spool) == []


def test_s3_outage_spools_then_everything_arrives(s3, tmp_path):
    """S3 down: submits stay instant, the spool grows, failures count; S3 back: all arrive."""
    store = open_store(s3.url())
    before = _payloads(store.prefix, 2, job="before")
    during = _payloads(store.prefix, 8, size=3000, job="during")
    with Uploader(store, tmp_path / "spool", 1 << 20, **FAST) as uploader:
        for key, data in before.items():
            uploader.submit(key, data)
        assert uploader.flush(10)

        s3.server.stop()
        slowest = 0.0
        for key, data in during.items():
            start = time.perf_counter()
            uploader.submit(key, data)
            slowest = max(slowest, time.perf_counter() - start)
        assert slowest < 0.1
        _wait_until(lambda: uploader.stats.failures >= 3)
        assert uploader.pending == 8 and uploader.spool_bytes == 8 * 3000
        assert sorted(iter_spool_keys(tmp_path / "spool")) == sorted(during)
        assert not uploader.flush(0.2)

        s3.server.start()
        s3.create_bucket()  # moto lost everything with the restart
        assert uploader.flush(20)
        assert (uploader.pending, uploader.spool_bytes) == (0, 0)
        stats = uploader.stats.snapshot()
    assert s3.objects() == during  # `before` went with the old server's memory
    assert stats["uploaded_files"] == 10 and stats["dropped_files"] == 0
    assert stats["failures"] >= 3
    assert _spool_files(tmp_path / "spool") == []


def test_spool_cap_drops_and_counts_the_rest_arrives(s3_no_bucket, tmp_path):
    """Beyond the cap, files are dropped and counted; everything accepted arrives."""
    store = open_store(s3_no_bucket.url())
    files = _payloads(store.prefix, 5)
    with Uploader(store, tmp_path / "spool", 3500, **FAST) as uploader:
        for key, data in files.items():
            uploader.submit(key, data)
        uploader.submit(trace_key(store.prefix, "huge", 0, T0), b"x" * 4000)
        assert uploader.pending == 3 and uploader.spool_bytes == 3000
        stats = uploader.stats.snapshot()
        assert (stats["dropped_files"], stats["dropped_bytes"]) == (3, 2000 + 4000)
        _wait_until(lambda: uploader.stats.failures >= 1)

        s3_no_bucket.create_bucket()
        assert uploader.flush(10)
        accepted = dict(list(files.items())[:3])
        assert s3_no_bucket.objects() == accepted
        late = _payloads(store.prefix, 1, job="late")  # room again once drained
        uploader.submit(*next(iter(late.items())))
        assert uploader.flush(10)
    assert s3_no_bucket.objects() == accepted | late
    assert uploader.stats.dropped_files == 3


def test_restarted_processor_resumes_the_spool(s3_no_bucket, tmp_path):
    """A new Uploader over an old spool uploads what the previous one left, oldest first."""
    store = open_store(s3_no_bucket.url())
    spool = tmp_path / "spool"
    files = _payloads(store.prefix, 3)
    long_key = trace_key(store.prefix, "j" * 150, 7, T0)  # too long for a file name: sidecar
    files[long_key] = b"long key"
    first = Uploader(store, spool, 1 << 20, **FAST)
    with pytest.raises(RuntimeError, match="in use"):
        Uploader(store, spool, 1 << 20)
    for key, data in files.items():
        first.submit(key, data)
    _wait_until(lambda: first.stats.failures >= 1)
    first.close(timeout=0.1)  # the processor stops while S3 is unusable
    _wait_until(lambda: not first._thread.is_alive())  # it releases the spool as it exits
    assert len(_spool_files(spool)) == 5  # 4 data files and the long key's sidecar
    assert list(iter_spool_keys(spool)) == list(files)
    (spool / ".tmp-00000000000000000099-crashed").write_bytes(b"half a file")
    (spool / f"{99:020d}.key").write_text("orphan/key")  # its data file never landed

    second = Uploader(store, spool, 1 << 20, **FAST)
    try:
        assert second.pending == 4
        assert second.spool_bytes == sum(map(len, files.values()))
        assert len(_spool_files(spool)) == 5  # the crash leftovers are gone
        newer = trace_key(store.prefix, "job/1", 9, T0 + MINUTE)
        second.submit(newer, b"after restart")
        assert list(iter_spool_keys(spool))[-1] == newer
        s3_no_bucket.create_bucket()
        assert second.flush(10)
    finally:
        second.close(5)
    assert s3_no_bucket.objects() == files | {newer: b"after restart"}
    assert _spool_files(spool) == []


class GatedStore:
    """An in-memory store whose puts fail while ``down`` and block while ``gate`` is clear."""

    prefix = ""
    url = "memory://"

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.order: list[str] = []
        self.attempts: list[float] = []
        self.down = False
        self.fail_next = 0
        self.gate = threading.Event()
        self.gate.set()

    def put(self, key: str, data: bytes) -> None:
        """Record the attempt; fail or block as configured."""
        self.attempts.append(time.monotonic())
        self.gate.wait()
        if self.down or self.fail_next:
            self.fail_next = max(self.fail_next - 1, 0)
            raise StoreError("down")
        self.objects[key] = data
        self.order.append(key)

    def list(self, prefix: str = "", *, start_after: str = ""):
        """Not needed by the uploader."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        """The stored bytes."""
        return self.objects[key]


def test_submit_never_blocks_on_a_hung_store(tmp_path):
    """While a put hangs, submits return at once and uploads keep submission order."""
    store = GatedStore()
    store.gate.clear()
    keys = [f"j/rank=0/{i:03d}" for i in range(50)]
    with Uploader(store, tmp_path / "spool", 1 << 20, **FAST) as uploader:
        # Submitting while the store hangs: a submit that waited for the store would never
        # return (the gate stays closed); no wall-clock bound, so a busy machine cannot fail it.
        submitter = threading.Thread(target=lambda: [uploader.submit(k, k.encode())
                                                     for k in keys])
        submitter.start()
        submitter.join(timeout=120)
        assert not submitter.is_alive() and not store.gate.is_set()
        assert uploader.pending == 50
        store.gate.set()
        assert uploader.flush(10)
    assert store.order == keys


def test_backoff_doubles_up_to_the_cap_and_resets(tmp_path):
    """Retry waits grow 1x, 2x, 4x ... up to max_backoff_s, and start over after a success."""
    store = GatedStore()
    store.fail_next = 5
    with Uploader(store, tmp_path / "spool", 1 << 20, backoff_s=0.04,
                  max_backoff_s=0.12) as uploader:
        uploader.submit("a", b"1")
        _wait_until(lambda: store.order == ["a"])
        waits = [b - a for a, b in zip(store.attempts, store.attempts[1:], strict=False)]
        expected = [0.04, 0.08, 0.12, 0.12, 0.12]
        assert len(waits) == 5
        for wait, floor in zip(waits, expected, strict=True):
            assert floor * 0.95 <= wait < floor * 1.2 + 0.1
        assert uploader.stats.failures == 5
        store.fail_next = 1
        uploader.submit("b", b"2")
        _wait_until(lambda: store.order == ["a", "b"])
        assert store.attempts[-1] - store.attempts[-2] < 0.04 * 1.2 + 0.03  # reset to 1x
    assert uploader.stats.failures == 6


def test_flush_cuts_a_long_backoff_short(tmp_path):
    """flush() retries at once instead of waiting out max_backoff_s."""
    store = GatedStore()
    store.down = True
    with Uploader(store, tmp_path / "spool", 1 << 20, backoff_s=30, max_backoff_s=60) as up:
        up.submit("a", b"1")
        _wait_until(lambda: up.stats.failures == 1)
        store.down = False
        start = time.monotonic()
        assert up.flush(5)
        assert time.monotonic() - start < 1
    assert store.objects == {"a": b"1"}


def test_upload_stats_add_is_thread_safe():
    """Concurrent increments are never lost; unknown counters are refused."""
    stats = UploadStats()

    def bump() -> None:
        """Increment two counters many times."""
        for _ in range(10_000):
            stats.add(failures=1, uploaded_bytes=2)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (stats.failures, stats.uploaded_bytes) == (40_000, 80_000)
    with pytest.raises(AttributeError):
        stats.add(bogus=1)


# --------------------------------------------------------------------------- argus traces


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``argus traces ARGV`` through a parser built with the module's register()."""
    parser = argparse.ArgumentParser(prog="argus")
    traces_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["traces", *argv])
    capsys.readouterr()
    code = args.run(args)
    out, err = capsys.readouterr()
    return code, out, err


JOB = "train/llama 70b"


def _fill(store) -> dict[str, bytes]:
    """Three ranks x four windows of JOB, plus another job sharing a name prefix."""
    files = {trace_key(store.prefix, JOB, rank, T0 + w * MINUTE): f"{rank}-{w}".encode() * 100
             for w in range(4) for rank in range(3)}
    files[trace_key(store.prefix, JOB + "x", 0, T0)] = b"other job"
    for key, data in files.items():
        store.put(key, data)
    return files


@pytest.fixture(params=["file", "s3"])
def filled(request, tmp_path):
    """(store URL, files) for a filled directory store and a filled S3 store."""
    if request.param == "file":
        url = (tmp_path / "traces").as_uri()
    else:
        url = request.getfixturevalue("s3").url("argus")
    return url, _fill(open_store(url))


def _rows(out: str) -> list[list[str]]:
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["JOB", "RANK"]
    return [line.rsplit(None, 5) for line in lines[1:]]  # job may contain spaces


def test_ls_lists_a_job_newest_last(capsys, filled):
    """All ranks and windows of the job (not the other job), oldest first, with sizes."""
    url, files = filled
    code, out, err = cli(capsys, "ls", "--store", url, "--job", JOB)
    assert code == 0, err
    rows = _rows(out)
    assert len(rows) == 12 and "12 trace file(s)" in err
    assert [row[0] for row in rows] == [JOB] * 12
    starts = [row[2] for row in rows]
    assert starts == sorted(starts) and starts[0] == "2026-11-18T12:00:00Z"
    assert starts[-1] == "2026-11-18T12:03:00Z"
    assert {row[-1] for row in rows} == {k for k in files if parse_key(k).job == JOB}
    assert rows[0][3:5] == ["300", "B"]


def test_ls_filters_rank_and_since(capsys, filled):
    """--rank keeps one rank; --since keeps windows starting at or after T."""
    url, _ = filled
    code, out, _ = cli(capsys, "ls", "--store", url, "--job", JOB, "--rank", "1")
    assert code == 0 and [row[1] for row in _rows(out)] == ["1"] * 4
    code, out, _ = cli(capsys, "ls", "--store", url, "--job", JOB, "--rank", "2",
                       "--since", "2026-11-18T12:02:00Z")
    assert code == 0
    assert [(row[1], row[2]) for row in _rows(out)] == [
        ("2", "2026-11-18T12:02:00Z"), ("2", "2026-11-18T12:03:00Z")]
    code, out, _ = cli(capsys, "ls", "--store", url, "--job", JOB, "--since", "2026-11-18T12:02:30")
    assert code == 0 and {row[2] for row in _rows(out)} == {"2026-11-18T12:03:00Z"}


def test_ls_since_an_age(capsys, tmp_path):
    """--since 1h and --since 30m ago count back from now."""
    url = (tmp_path / "traces").as_uri()
    store = open_store(url)
    now = time.time_ns() // MINUTE * MINUTE
    store.put(trace_key("", "j", 0, now - 180 * MINUTE), b"old")
    store.put(trace_key("", "j", 0, now - 10 * MINUTE), b"new")
    for since in (["1h"], ["30m", "ago"], ["1h30m ago"]):
        code, out, err = cli(capsys, "ls", "--store", url, "--job", "j", "--since", *since)
        assert code == 0, err
        assert len(_rows(out)) == 1
    code, _, err = cli(capsys, "ls", "--store", url, "--job", "j", "--since", "5m")
    assert code == 2 and "no traces of job 'j' since" in err


def test_ls_errors_exit_2(capsys, filled, tmp_path):
    """No match, a bad time and an unknown store scheme are one-line errors, exit status 2."""
    url, _ = filled
    code, out, err = cli(capsys, "ls", "--store", url, "--job", "nope")
    assert (code, out) == (2, "") and "no traces of job 'nope'" in err
    code, _, err = cli(capsys, "ls", "--store", url, "--job", JOB, "--since", "yesterday-ish")
    assert code == 2 and "not a time" in err
    code, _, err = cli(capsys, "ls", "--store", "gs://bucket", "--job", JOB)
    assert code == 2 and "unsupported store URL" in err
    code, _, err = cli(capsys, "ls", "--store", str(tmp_path), "--job", JOB)
    assert code == 2 and f"file://{tmp_path}" in err


def test_ls_unreachable_s3_exits_2(capsys, s3_env, monkeypatch):
    """An S3 endpoint nobody listens on fails fast with the endpoint in the message."""
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    start = time.monotonic()
    code, _, err = cli(capsys, "ls", "--store", "s3://bucket-x/argus", "--job", JOB)
    assert code == 2 and dead in err
    assert time.monotonic() - start < 10


def test_store_defaults_to_argus_store_env(capsys, tmp_path, monkeypatch):
    """Without --store, $ARGUS_STORE names the store."""
    url = (tmp_path / "traces").as_uri()
    _fill(open_store(url))
    monkeypatch.setenv("ARGUS_STORE", url)
    code, out, _ = cli(capsys, "ls", "--job", JOB, "--rank", "0")
    assert code == 0 and len(_rows(out)) == 4


def test_get_downloads_and_says_how_to_open(capsys, filled, tmp_path):
    """--latest (the default), --at T and --key write the exact bytes and print the hint."""
    url, files = filled
    out_dir = tmp_path / "downloads"
    code, out, err = cli(capsys, "get", "--store", url, "--job", JOB, "--rank", "2",
                         "-o", str(out_dir))
    assert code == 0, err
    path, hint = out.strip().splitlines()
    assert Path(path).parent == out_dir
    latest = trace_key(open_store(url).prefix, JOB, 2, T0 + 3 * MINUTE)
    assert Path(path).read_bytes() == files[latest]
    assert Path(path).name == "train%2Fllama%2070b.rank2.20261118T120300Z.pftrace.gz"
    assert "https://ui.perfetto.dev" in hint and "Open trace file" in hint

    code, out, _ = cli(capsys, "get", "--store", url, "--job", JOB, "--rank", "1",
                       "--at", "2026-11-18T12:01:59Z", "-o", str(out_dir))
    assert code == 0
    key = trace_key(open_store(url).prefix, JOB, 1, T0 + MINUTE)
    assert Path(out.splitlines()[0]).read_bytes() == files[key]

    code, out, _ = cli(capsys, "get", "--store", url, "--key", key, "-o", str(tmp_path / "k"))
    assert code == 0 and Path(out.splitlines()[0]).read_bytes() == files[key]


def test_get_errors_exit_2(capsys, filled, tmp_path):
    """Nothing at or before T, a missing key, or no selection: exit status 2."""
    url, _ = filled
    code, _, err = cli(capsys, "get", "--store", url, "--job", JOB, "--rank", "0",
                       "--at", "2026-11-18T11:59:59Z", "-o", str(tmp_path))
    assert code == 2 and "at or before 2026-11-18T11:59:59Z" in err
    code, _, err = cli(capsys, "get", "--store", url, "--job", JOB, "--rank", "9")
    assert code == 2 and "no traces" in err
    code, _, err = cli(capsys, "get", "--store", url, "--key", "argus/j/rank=0/none.pftrace.gz",
                       "-o", str(tmp_path))
    assert code == 2 and "no such trace" in err
    code, _, err = cli(capsys, "get", "--store", url, "--job", JOB)
    assert code == 2 and "--rank" in err


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-18T12:00:00Z", T0),
    ("2026-11-18T12:00:00", T0),
    ("2026-11-18 13:00:00+01:00", T0),
    ("2026-11-18T12:00:00.5Z", T0 + 500_000_000),
    ("20261118T120000Z", T0),
    ("2h", T0 - 120 * MINUTE),
    ("30m ago", T0 - 30 * MINUTE),
    ("1h30m", T0 - 90 * MINUTE),
    ("1d", T0 - 1440 * MINUTE),
])
def test_parse_time(text, expected):
    """ISO-8601 (UTC without a zone), the key's compact form, and ages."""
    assert traces_cli.parse_time(text, now_ns=T0) == expected


def test_parse_time_rejects_garbage():
    """Anything else is a ValueError that shows the accepted forms."""
    with pytest.raises(ValueError, match="30m ago"):
        traces_cli.parse_time("soon")


def test_find_traces_since_uses_start_after(filled):
    """find_traces with a rank and since lists only what it keeps (the S3 StartAfter path)."""
    url, _ = filled
    store = open_store(url)
    found = find_traces(store, JOB, 0, since_ns=T0 + 2 * MINUTE + 1)
    assert [ref.window_start_ns for ref, _ in found] == [T0 + 3 * MINUTE]
    found = find_traces(store, JOB, None, since_ns=T0 + 3 * MINUTE)
    assert [ref.rank for ref, _ in found] == [0, 1, 2]
