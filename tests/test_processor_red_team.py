"""The processor attacked as a hostile client, a broken network and a careless operator would
(issue 20): one small body spreading records over a day, records spread over many windows,
concurrent chunked bodies, one rank's clock glitch, a /metrics of 10,000 ranks, and auth left
off by mistake. Each test asserts what a user relies on: answers, RSS, file descriptors,
nothing acknowledged lost."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
from processor_support import T0, W, config, kernel_batch, ndjson_gz, run, start_processor
from prometheus_client.parser import text_string_to_metric_families
from support import free_port

from argus_core.processor.core import Processor
from argus_core.processor.windows import Window
from argus_core.summaries import KernelSummary

MINUTE_NS = 60 * 10**9


def current_window() -> int:
    """The start of the current minute, read when a test builds its body (the suite can run
    for longer than the processor's clock tolerances)."""
    return time.time_ns() // W * W


def spread_batch(rank: int, windows: int, job: str = "spread", end_ns: int | None = None) -> dict:
    """One kernel per minute for ``windows`` minutes up to ``end_ns`` (default: the current
    minute): one kernel per window."""
    end_ns = current_window() if end_ns is None else end_ns
    start = end_ns - (windows - 1) * MINUTE_NS + 1000
    return {"v": 1, "kind": "kernels", "job": job, "rank": rank, "names": ["gemm"],
            "name": [0] * windows, "stream": [7] * windows,
            "start_ns": [start + i * MINUTE_NS for i in range(windows)],
            "dur_ns": [50_000] * windows}


def status_of(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def descriptors(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def http(port: int, path: str, body: bytes | None = None, timeout: float = 30) -> tuple:
    """(status, JSON or text answer) of one request."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     headers={"Content-Encoding": "gzip"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, data = exc.code, exc.read()
    try:
        return status, orjson.loads(data)
    except orjson.JSONDecodeError:
        return status, data.decode()


def metric(text: str, name: str, **labels) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(name)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


# --------------------------------------------------------------------- windows (item 1)


def test_one_small_body_spreading_kernels_over_a_day_is_refused_whole(tmp_path):
    """20 kernel records, each one kernel a minute for the 24 h --max-age allows (a 78 KB
    gzipped body), would open 28,600 windows: it is refused with 413 naming the bound, before
    anything is logged, and costs the processor neither memory nor descriptors."""
    proc, port = start_processor(tmp_path, f"file://{tmp_path}/store")
    try:
        body = ndjson_gz(*(spread_batch(rank, 1430) for rank in range(20)))
        assert len(body) < 200_000
        before_fds, before = descriptors(proc.pid), status_of(proc.pid)
        status, answer = http(port, "/v1/records", body)
        assert status == 413, answer
        assert "--max-body-windows" in answer["error"] and answer["accepted"] == 0
        after = status_of(proc.pid)
        assert after["VmHWM"] - before["VmRSS"] < 64 * 1024  # KB
        assert descriptors(proc.pid) <= before_fds + 8
        _, text = http(port, "/metrics")
        assert metric(text, "argus_processor_open_windows") == 0
        assert metric(text, "argus_processor_rejected_records_total", reason="windows") == 20
        fresh = ndjson_gz(kernel_batch(0, current_window() + 1000))
        assert http(port, "/v1/records", fresh)[0] == 200
    finally:
        stop(proc)
    assert len(list((tmp_path / "store").rglob("*.pftrace.gz"))) == 1


def test_records_spread_within_the_bounds_keep_windows_and_descriptors_bounded(tmp_path):
    """Two ranks with a kernel in each of 500 past minutes (inside the per-body bound) under
    a small memory budget: each rank keeps at most --max-windows-per-rank windows open (the
    oldest close early, in order, so none of the body's records goes late), the writer holds
    no descriptor per window, and every acknowledged kernel is written."""
    processor = Processor(config(tmp_path, memory_budget_bytes=48 << 20, durability="write"))
    processor.recover()
    baseline = descriptors()
    body = ndjson_gz(spread_batch(0, 500, end_ns=T0), spread_batch(1, 500, end_ns=T0))
    answer = processor.ingest(body, "gzip")
    assert answer.status == 200 and "late_kernels" not in answer.body, answer.body
    per_rank = [sum(1 for key in processor.windows.open if key[1] == r) for r in (0, 1)]
    assert max(per_rank) <= processor.config.max_windows_per_rank
    peak = baseline
    deadline = time.monotonic() + 120
    while processor.stats.windows_written < 2 * 500 - sum(per_rank):
        peak = max(peak, descriptors())
        assert time.monotonic() < deadline, "the writer did not catch up"
        time.sleep(0.01)
    assert peak <= baseline + 8
    processor.drain(timeout=60)
    assert processor.stats.windows_written == 1000
    assert processor.stats.kernel_events_written == 1000
    assert processor.stats.closed_early >= 1000 - 2 * processor.config.max_windows_per_rank
    assert len(list((tmp_path / "store").rglob("*.pftrace.gz"))) == 1000


# --------------------------------------------------------------------- bodies (item 1)


class ChunkedUpload:
    """A chunked POST of ``size`` zero bytes, sent a piece at a time."""

    def __init__(self, port: int, size: int, piece: int = 1 << 20):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(b"POST /v1/records HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n")
        self.piece, self.left = piece, size

    def send_piece(self) -> bool:
        """Send the next chunk (or the last); False once complete or cut off."""
        n = min(self.piece, self.left)
        try:
            if n == 0:
                self.sock.sendall(b"0\r\n\r\n")
                return False
            self.sock.sendall(b"%x\r\n" % n + b"\x00" * n + b"\r\n")
        except OSError:  # the processor answered and closed: the body was refused
            return False
        self.left -= n
        return True


def answer_of(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            piece = sock.recv(65536)
        except OSError:
            break
        if not piece:
            break
        data += piece
    return data


def test_concurrent_chunked_bodies_are_charged_as_they_arrive(tmp_path):
    """Six concurrent 24 MB chunked bodies against a 32 MB budget: the bytes are charged as
    they are read, the bodies that do not fit are refused with 503 naming the budget
    (Retry-After), and RSS stays far below what holding them all would take."""
    proc, port = start_processor(tmp_path, f"file://{tmp_path}/store", None,
                                 "--memory-budget-mb", "32")
    uploads: list[ChunkedUpload] = []
    try:
        before = status_of(proc.pid)
        uploads = [ChunkedUpload(port, 24 << 20) for _ in range(6)]
        sending = list(uploads)
        while sending:
            sending = [upload for upload in sending if upload.send_piece()]
        answers = [answer_of(upload.sock) for upload in uploads]
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= 4, answers
        assert all(b"memory budget" in a and b"Retry-After" in a for a in refused)
        peak_mb = (status_of(proc.pid)["VmHWM"] - before["VmRSS"]) / 1024
        assert peak_mb < 100, f"RSS grew {peak_mb:.0f} MB"
        _, text = http(port, "/metrics")
        assert metric(text, "argus_processor_rejected_records_total", reason="memory") >= 4
        assert metric(text, "argus_processor_memory_bytes", kind="bodies") == 0
    finally:
        for upload in uploads:
            upload.sock.close()
        stop(proc)


# --------------------------------------------------------------------- lateness (item 2)


def test_one_ranks_clock_glitch_and_forgetting_make_no_other_job_late(tmp_path):
    """A record stamped 280 s ahead (inside --max-skew) opens a future window that closes by
    idleness; then enough identities pass --max-ranks for that rank to be forgotten. Neither
    the rank's own present records nor a brand-new job's are dropped as late (they used to
    be, for ~280 s, behind a store-wide floor)."""
    processor = Processor(config(tmp_path, window_s=1, grace_s=0.2, max_ranks=8,
                                 max_skew_s=300))
    processor.recover()
    now = time.time_ns()
    ahead = kernel_batch(0, now + 280 * 10**9, n=3, job="glitch")
    assert processor.ingest(ndjson_gz(ahead), "gzip").status == 200
    deadline = time.monotonic() + 30
    while processor.windows.open:  # the future window closes after 1.2 s of silence
        assert time.monotonic() < deadline
        processor.maintain()
        time.sleep(0.05)
    present = kernel_batch(0, time.time_ns(), n=3, job="glitch", seed=1)
    assert "late_kernels" not in processor.ingest(ndjson_gz(present), "gzip").body
    while processor.windows.open:  # a rank with an open window is never forgotten
        assert time.monotonic() < deadline
        processor.maintain()
        time.sleep(0.05)
    identities = [{"v": 1, "kind": "rank", "job": "flood", "rank": r, "world_size": 64,
                   "host": "h"} for r in range(64)]
    assert processor.ingest(ndjson_gz(*identities), "gzip").status == 200
    deadline = time.monotonic() + 30
    while ("glitch", 0) in processor.windows.ranks:
        assert time.monotonic() < deadline
        processor.maintain()
        time.sleep(0.05)
    fresh = kernel_batch(3, time.time_ns(), n=200, job="brand-new")
    answer = processor.ingest(ndjson_gz(fresh), "gzip")
    assert answer.status == 200 and "late_kernels" not in answer.body, answer.body
    # the forgotten rank keeps its own floor: its written future window stays closed
    again = kernel_batch(0, now + 280 * 10**9 + 10, n=2, job="glitch", seed=2)
    assert processor.ingest(ndjson_gz(again), "gzip").body.get("late_kernels") == 2
    processor.close()


# --------------------------------------------------------------------- /metrics (item 1)


def summaries_for(processor: Processor, ranks: int, kernels: int = 32) -> None:
    names = [f"sm90_xmma_gemm_bf16_bf16_f32_variant_{i}" for i in range(kernels)]
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        summary = KernelSummary(
            rank=np.full(kernels, rank), kernel=np.arange(kernels), stream=np.full(kernels, 7),
            window=np.full(kernels, 5), cluster=np.zeros(kernels, dtype=np.int64),
            count=rng.integers(10, 1000, kernels), sum_ns=np.full(kernels, 10**7),
            p50_ns=rng.integers(10**4, 10**6, kernels), p99_ns=np.full(kernels, 2 * 10**6),
            names=names, window_ns=W)
        processor._keep_summary(Window(f"job-{rank // 1000}", rank, 5, W), summary)


def test_metrics_of_thousands_of_ranks_never_stall_healthz(tmp_path):
    """/metrics with summaries for 4,000 ranks is rendered off the event loop: /healthz
    keeps answering meanwhile (8,000 ranks made it wait up to 56 s), and the series are
    bounded by --max-metrics-series with the ranks left out counted (10,000 ranks:
    bench/processor_metrics.py)."""
    import threading

    processor = Processor(config(tmp_path, max_metrics_series=300_000))
    summaries_for(processor, 4_000)
    service = sys.modules["argus_core.processor.service"]
    original, threads = service.render_metrics, []

    def recording(*args):
        threads.append(threading.current_thread())
        return original(*args)

    async def scenario(client):
        loop_thread = threading.current_thread()
        service.render_metrics = recording
        try:
            scrape = asyncio.create_task(client.get("/metrics",
                                                    headers={"Accept-Encoding": "identity"}))
            worst = 0.0
            while not scrape.done():
                started = time.monotonic()
                assert (await client.get("/healthz")).status == 200
                worst = max(worst, time.monotonic() - started)
                await asyncio.sleep(0.02)
            response = await scrape
            text = await response.text()
        finally:
            service.render_metrics = original
        assert threads and loop_thread not in threads  # never rendered on the event loop
        # (the whole render on the loop took ~5 s here; a loaded machine may stall a probe)
        assert worst < 2.5, f"/healthz took {worst:.2f} s during a scrape"
        series = sum(1 for line in text.splitlines() if line.startswith("argus_kernel_"))
        assert series <= 300_000
        left_out = metric(text, "argus_processor_metrics_left_out_ranks")
        per_rank = 96 + 2  # 32 kernels x 3, and the two series summing the rest
        assert left_out == 4_000 - 300_000 // per_rank
        assert series == per_rank * (4_000 - left_out)

    run(processor, scenario)


def test_concurrent_scrapes_share_one_rendering(tmp_path):
    """Scrapes arriving during a rendering wait for the next one instead of each starting
    their own (ten scrapers cannot multiply the CPU /metrics takes)."""
    processor = Processor(config(tmp_path))
    summaries_for(processor, 2_000)
    renders = []
    from argus_core.processor import metrics as metrics_module

    original = metrics_module.render_metrics

    def counting(*args):
        renders.append(1)
        return original(*args)

    async def scenario(client):
        service = sys.modules["argus_core.processor.service"]
        service.render_metrics = counting
        try:
            answers = await asyncio.gather(*(client.get("/metrics") for _ in range(10)))
            texts = [await a.text() for a in answers]
        finally:
            service.render_metrics = original
        assert all(t == texts[0] or len(t) > 1000 for t in texts)
        assert len(renders) <= 3

    run(processor, scenario)


# --------------------------------------------------------------------- auth (item 5)


def processor_command(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "argus_core.cli", "processor", "--store",
            f"file://{tmp_path}/store", "--spool", str(tmp_path / "spool"), *args]


def test_a_public_address_without_a_token_refuses_to_start(tmp_path):
    """--listen 0.0.0.0 with no token exits 2 saying what to do, unless --insecure."""
    env = {k: v for k, v in os.environ.items() if k != "ARGUS_PROCESSOR_TOKEN"}
    done = subprocess.run(processor_command(tmp_path, "--listen", f"0.0.0.0:{free_port()}"),
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "without a token" in done.stderr and "--insecure" in done.stderr
    port = free_port()
    proc = subprocess.Popen(processor_command(tmp_path, "--listen", f"0.0.0.0:{port}",
                                              "--insecure"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if http(port, "/healthz", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        stop(proc)


@pytest.mark.parametrize("option", ["--token-env", "--read-token-env"])
def test_a_named_token_variable_that_is_unset_refuses_to_start(tmp_path, option):
    """--token-env ARGUS_TOKEN_TYPO while ARGUS_PROCESSOR_TOKEN is set used to ignore the
    token and accept unauthenticated posts: now it names the variable and exits 2."""
    env = {**os.environ, "ARGUS_PROCESSOR_TOKEN": "s3cret"}
    env.pop("ARGUS_TOKEN_TYPO", None)
    done = subprocess.run(processor_command(tmp_path, "--listen", f"127.0.0.1:{free_port()}",
                                            option, "ARGUS_TOKEN_TYPO"),
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "$ARGUS_TOKEN_TYPO" in done.stderr


def test_floors_fold_per_job_and_survive_a_snapshot():
    """Beyond ``max_floors`` the oldest rank floors fold into their job's floor (never into
    another job's), and floors and windows closed ahead come back from a log snapshot."""
    from argus_core.processor.windows import WindowStore

    clock = [102 * W]
    store = WindowStore(60, 5, max_floors=2, clock_ns=lambda: clock[0])
    for job, rank in (("a", 0), ("a", 1), ("b", 0)):
        store.add(KernelBatchRecord(job, rank, 100 * W + 1))
        store.add(KernelBatchRecord(job, rank, 103 * W + 1))  # ahead of the clock
    for handover in store.close_all():
        assert handover.window.index in (100, 103)
    assert store.ranks[("a", 0)].closed_below == 101
    assert store.ranks[("a", 0)].closed_ahead == {103}
    store.expire(0, 0)
    assert store.floors.folded == 1 and set(store.floors.jobs) == {"a"}
    again = WindowStore(60, 5, max_floors=2, clock_ns=lambda: clock[0])
    again.restore(orjson.loads(orjson.dumps(store.snapshot())))
    for key in (("a", 0, 100), ("a", 0, 103), ("a", 1, 103), ("b", 0, 103)):
        assert again.is_closed(key), key
    assert not again.is_closed(("b", 0, 102)) and not again.is_closed(("c", 0, 100))
    assert again.is_closed(("a", 5, 103))  # a's folded floor: every rank of job a


def KernelBatchRecord(job: str, rank: int, start_ns: int):  # noqa: N802 - reads as a record
    from argus_core.schema import parse_record

    return parse_record({"v": 1, "kind": "kernels", "job": job, "rank": rank,
                         "names": ["gemm"], "name": [0], "stream": [7], "start_ns": [start_ns],
                         "dur_ns": [1000]})


def test_a_rank_forgotten_before_its_window_is_written_keeps_its_host(tmp_path):
    """With the writer behind (10,000 windows queued), a rank can be forgotten after its
    window closed and before it is written: the file still names the rank's host."""
    import threading

    from processor_support import named_events

    processor = Processor(config(tmp_path, state_ttl_s=0.01))
    processor.recover()
    identity = {"v": 1, "kind": "rank", "job": "llm", "rank": 0, "world_size": 1,
                "host": "node-17"}
    assert processor.ingest(ndjson_gz(identity, kernel_batch(0, T0 + 1000, n=5)),
                            "gzip").status == 200
    gate = threading.Event()
    processor._writer.submit(gate.wait, 30)  # the writer is busy elsewhere
    futures = processor.close_due(everything=True)
    time.sleep(0.05)
    processor.maintain()
    assert ("llm", 0) not in processor.windows.ranks
    gate.set()
    for future in futures:
        future.result(30)
    processor.drain(timeout=30)
    (path,) = (tmp_path / "store").rglob("*.pftrace.gz")
    assert any("node-17" in name for name in named_events(path.read_bytes()))


def test_floors_older_than_max_age_are_dropped():
    """Nothing older than --max-age is accepted, so its floors need not be kept."""
    from argus_core.processor.windows import WindowStore

    clock = [102 * W]
    store = WindowStore(60, 5, max_age_s=3600, clock_ns=lambda: clock[0])
    for rank in range(3):
        store.add(KernelBatchRecord("a", rank, 100 * W + 1))
    store.close_all()
    store.expire(0, 0)
    assert len(store.floors) == 3 and store.is_closed(("a", 1, 100))
    clock[0] += 3 * 3600 * 10**9
    store.expire(0, 0)
    assert len(store.floors) == 0
