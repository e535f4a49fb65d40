"""The processor against what production sends: clock glitches, huge and slow bodies, floods of
stack samples, ranks and kernel names, slow-loris clients, and the small things (auth scheme
case, late counts, a missing bucket, a valid exposition for Prometheus)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import socket
import subprocess
import threading
import time

import pytest
from processor_support import T0, config, kernel_batch, ndjson_gz, post, run
from prometheus_client.parser import text_string_to_metric_families

from argus_core.processor.core import Processor
from argus_core.processor.logs import RateLimit, configure_logging
from argus_core.processor.service import GUARD_KEY

HOUR_NS = 3600 * 10**9


def step(rank: int, t_ns: int, number: int = 1, job: str = "llm") -> dict:
    return {"v": 1, "kind": "step", "job": job, "rank": rank, "step": number, "t_ns": t_ns,
            "wall_s": 0.5, "gpu_s": 0.4, "phases": {"forward": 0.2}}


def stack(rank: int, t_ns: int, frames: int = 30, job: str = "llm") -> dict:
    return {"v": 1, "kind": "stack", "job": job, "rank": rank, "t_ns": t_ns,
            "thread": "MainThread",
            "frames": [f"site-packages/torch/nn/modules/module.py:_call_impl:{i}"
                       for i in range(frames)]}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


# --------------------------------------------------------------------------- clocks (item 2)


def test_a_record_an_hour_ahead_is_refused_and_its_rank_keeps_going(tmp_path):
    """A kernel stamped an hour ahead (a clock glitch) is refused with a 400 naming the field;
    the rank's next records are accepted, not dropped as late until a restart."""
    processor = Processor(config(tmp_path))
    now = processor.clock_ns()

    async def scenario(client):
        glitch = kernel_batch(0, now - 10**9, n=20)
        glitch["start_ns"][7] = now + HOUR_NS
        response = await post(client, ndjson_gz(glitch))
        answer = await response.json()
        assert response.status == 400 and answer["accepted"] == 0
        assert answer["errors"][0].startswith("line 1: start_ns[7]: 3600 s ahead of the "
                                              "processor's clock")
        response = await post(client, ndjson_gz(kernel_batch(0, now - 5 * 10**9, n=20),
                                                step(0, now - 4 * 10**9)))
        assert response.status == 200
        assert await response.json() == {"accepted": 2, "rejected": 0}

    run(processor, scenario)
    assert processor.stats.kernel_events_written == 20
    assert processor.stats.rejected["start_ns"] == 1


def test_a_record_within_the_skew_does_not_close_windows_still_filling(tmp_path):
    """A kernel 4 minutes ahead (within --max-skew) is kept, but the rank's watermark never
    runs more than the grace period past the processor's clock: the current window stays
    open and the rank's next records are not late."""
    processor = Processor(config(tmp_path))
    processor.recover()
    now = processor.clock_ns()
    # a second ago, but never before the window the clock is in (a window that ended in
    # that second is rightly closed by the record ahead, whatever the rule)
    recent = now - min(10**9, now % (60 * 10**9))
    current = kernel_batch(0, recent, n=5)
    assert processor.ingest(ndjson_gz(current), "gzip").status == 200
    ahead = kernel_batch(0, now + 240 * 10**9, n=5)
    assert processor.ingest(ndjson_gz(ahead), "gzip").status == 200
    processor.close_due()
    answer = processor.ingest(ndjson_gz(kernel_batch(0, recent + 500, n=5, seed=1)), "gzip")
    assert answer.status == 200 and "late_kernels" not in answer.body
    processor.drain(timeout=30)
    assert processor.stats.kernel_events_written == 15


@pytest.mark.parametrize("record, field", [
    (lambda now: step(0, now - 2 * 86_400 * 10**9), "t_ns"),  # two days old
    (lambda now: stack(0, now + 2 * HOUR_NS), "t_ns"),
])
def test_steps_and_stacks_outside_the_clock_bounds_are_refused(tmp_path, record, field):
    """Steps and stack samples far from the present are refused naming ``t_ns``."""
    processor = Processor(config(tmp_path))
    processor.recover()
    answer = processor.ingest(ndjson_gz(record(processor.clock_ns())), "gzip")
    assert answer.status == 400 and answer.body["errors"][0].startswith(f"line 1: {field}: ")
    processor.close()


# --------------------------------------------------------------------------- event loop (item 3)


def test_healthz_answers_while_a_body_is_being_parsed(tmp_path, monkeypatch):
    """Parsing runs off the event loop: /healthz and /metrics answer while a body is still
    being decoded (a 63 MB body used to block /healthz for 4.5 s, 3 M gzip members for
    minutes)."""
    import argus_core.processor.core as core

    parsing = threading.Event()
    release = threading.Event()
    real = core.parse_body

    def slow_parse(*args, **kwargs):
        parsing.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "parse_body", slow_parse)
    processor = Processor(config(tmp_path))

    async def scenario(client):
        posting = asyncio.ensure_future(post(client, ndjson_gz(kernel_batch(0, T0 + 1000))))
        try:
            await asyncio.get_running_loop().run_in_executor(None, parsing.wait, 10)
            assert parsing.is_set()
            health = await asyncio.wait_for(client.get("/healthz"), 5)
            assert health.status == 200
            metrics = await asyncio.wait_for(client.get("/metrics"), 5)
            assert metrics.status == 200
            assert not posting.done()
        finally:
            release.set()
        assert (await posting).status == 200

    run(processor, scenario)


# --------------------------------------------------------------------------- memory (item 6)


def test_stack_samples_count_against_the_budget(tmp_path):
    """A flood of stack samples fills the budget like kernels do: 503 and /readyz not ready
    (12 bodies of stacks used to take RSS to 2.9 GB with /readyz still ready)."""
    processor = Processor(config(tmp_path, memory_budget_bytes=4 << 20))
    processor.recover()
    stalled = threading.Event()
    processor._writer.submit(stalled.wait)  # the disk is slow: nothing gets written
    now = processor.clock_ns()

    async def scenario(client):
        try:
            statuses = []
            for i in range(40):
                body = ndjson_gz(*[stack(0, now - 10**9 + i * 1000 + j) for j in range(200)])
                response = await post(client, body)
                statuses.append(response.status)
                if response.status == 503:
                    break
            assert statuses[-1] == 503 and set(statuses[:-1]) == {200}
            ready = await client.get("/readyz")
            assert ready.status == 503
            assert "memory budget" in " ".join((await ready.json())["reasons"])
            memory = families(await (await client.get("/metrics")).text())
            held = {s.labels["kind"]: s.value
                    for s in memory["argus_processor_memory_bytes"].samples}
            assert held["writer"] + held["records"] > 2 << 20
            assert sum(held.values()) < (4 << 20) + (1 << 20)  # at most a body past it
        finally:
            stalled.set()

    run(processor, scenario)


def test_step_records_count_against_the_budget(tmp_path):
    """Steps are held until their window closes: they count too."""
    processor = Processor(config(tmp_path, memory_budget_bytes=1 << 20))
    processor.recover()
    now = processor.clock_ns()
    statuses = []
    for i in range(60):
        answer = None
        if processor.busy() is None:
            answer = processor.ingest(ndjson_gz(*[step(0, now - 10**9 + i * 1000 + j, j)
                                                  for j in range(500)]), "gzip")
        statuses.append(answer.status if answer else 503)
        if statuses[-1] == 503:
            break
    assert statuses[-1] == 503 and "memory budget" in processor.busy()
    processor.close()


# --------------------------------------------------------------------------- forgetting (item 7)


def test_idle_ranks_are_forgotten_with_their_summaries(tmp_path):
    """After --state-ttl without records, a rank's identity, state and summaries are gone
    from memory and from /metrics (10,240 ranks used to stay on /metrics for ever)."""
    processor = Processor(config(tmp_path))
    texts = []

    async def scenario(client):
        for job in ("a", "b"):
            records = []
            for rank in range(20):
                records.append({"v": 1, "kind": "rank", "job": job, "rank": rank,
                                "world_size": 20, "host": f"h{rank}"})
                records.append(kernel_batch(rank, T0 + 1000, n=50, job=job))
            assert (await post(client, ndjson_gz(*records))).status == 200
        loop = asyncio.get_running_loop()
        for future in processor.close_due(everything=True):
            await asyncio.wrap_future(future)
        texts.append(await (await client.get("/metrics")).text())
        # The ranks stay idle past their TTL (shortened here rather than waited out).
        processor.config = dataclasses.replace(processor.config, state_ttl_s=0.001)
        await asyncio.sleep(0.01)
        await loop.run_in_executor(None, processor.maintain)
        texts.append(await (await client.get("/metrics")).text())

    run(processor, scenario)
    before, after = (families(t) for t in texts)
    assert len(before["argus_rank_info"].samples) == 40
    assert {s.labels["job"] for s in before["argus_kernel_executions"].samples} == {"a", "b"}
    assert not after["argus_rank_info"].samples
    assert not after["argus_kernel_executions"].samples
    tracked = after["argus_processor_tracked_ranks"].samples[0].value
    held = {s.labels["kind"]: s.value for s in after["argus_processor_memory_bytes"].samples}
    assert tracked == 0 and held["ranks"] == 0 and held["summaries"] == 0
    assert len(texts[1]) < len(texts[0]) / 2


def test_a_forgotten_rank_never_reopens_a_written_window(tmp_path):
    """A late record for a window written before its rank was forgotten stays late: the
    window's file is never overwritten by a second one with the same key."""
    processor = Processor(config(tmp_path, state_ttl_s=0.01))
    processor.recover()
    assert processor.ingest(ndjson_gz(kernel_batch(0, T0 + 1000, n=30)), "gzip").status == 200
    for future in processor.close_due(everything=True):
        future.result(10)
    time.sleep(0.05)
    processor.maintain()
    assert not processor.windows.ranks
    answer = processor.ingest(ndjson_gz(kernel_batch(0, T0 + 5000, n=4, seed=9)), "gzip")
    assert answer.body.get("late_kernels") == 4
    processor.drain(timeout=30)
    assert processor.stats.windows_written == 1


def test_ranks_beyond_the_cap_are_forgotten_least_recently_seen_first(tmp_path):
    """--max-ranks bounds the state: a flood of identities keeps the newest."""
    processor = Processor(config(tmp_path, max_ranks=10))
    processor.recover()
    identities = [{"v": 1, "kind": "rank", "job": "flood", "rank": r, "world_size": 100,
                   "host": "h"} for r in range(100)]
    assert processor.ingest(ndjson_gz(*identities), "gzip").status == 200
    processor.maintain()
    assert sorted(r for _, r in processor.windows.ranks) == list(range(90, 100))
    processor.close()


def test_kernel_names_go_with_their_window(tmp_path):
    """Two million distinct kernel names used to stay in memory (2.7 GB) for good: names are
    interned per window, counted while it is open, and gone once it is written."""
    processor = Processor(config(tmp_path, top_k=4))
    processor.recover()
    names = [f"kernel_{i}_" + "x" * 100 for i in range(20_000)]
    batch = {"v": 1, "kind": "kernels", "job": "llm", "rank": 0, "names": names,
             "name": list(range(20_000)), "stream": [7] * 20_000,
             "start_ns": [T0 + 1000 + i * 1000 for i in range(20_000)], "dur_ns": [500] * 20_000}
    assert processor.ingest(ndjson_gz(batch), "gzip").status == 200
    assert processor.memory()["records"] > 20_000 * 200  # the names count while open
    for future in processor.close_due(everything=True):
        future.result(30)
    held = processor.memory()
    assert held["records"] == 0 and held["kernels"] == 0
    (_, summary), = processor.latest.values()
    assert len(summary.names) == 4  # /metrics keeps the top kernels' names, not the table
    text, left_out = processor.summary_exposition()  # ... and sums up the rest per rank
    assert left_out == 0
    assert 'argus_kernel_tail_kernels{job="llm",rank="0"} 19996.0\n' in text
    tail = next(line for line in text.splitlines()
                if line.startswith('argus_kernel_tail_seconds{job="llm",rank="0"}'))
    assert float(tail.split()[-1]) == pytest.approx(19_996 * 500e-9)
    processor.drain(timeout=30)


# --------------------------------------------------------------------------- connections (item 8)


def raw_connection(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    return sock


def wait_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece


def test_slow_loris_clients_are_cut_off(tmp_path):
    """A client that stops sending its headers, or its body, is disconnected after the idle
    or read timeout (a byte every 15 s used to hold a connection for ever)."""
    processor = Processor(config(tmp_path, idle_timeout_s=1.0, read_timeout_s=0.5))

    async def scenario(client):
        port = client.server.port
        loop = asyncio.get_running_loop()
        headers_only = raw_connection(port)
        headers_only.sendall(b"POST /v1/records HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        body_stalls = raw_connection(port)
        body_stalls.sendall(b"POST /v1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                            b"Content-Encoding: identity\r\n\r\n" + b"{" * 10)
        # (each socket times out after 15 s: a connection held for ever fails the test)
        answer = await loop.run_in_executor(None, wait_closed, body_stalls)
        assert answer.startswith(b"HTTP/1.1 408")
        assert await loop.run_in_executor(None, wait_closed, headers_only) == b""
        health = await client.get("/healthz")
        assert health.status == 200

    run(processor, scenario)
    assert processor.stats.rejected["body"] == 1


def test_connections_beyond_the_cap_evict_the_stalled_ones(tmp_path):
    """With the cap reached by clients that send nothing, /healthz and a real post still get
    through: the connection stalled longest makes room (20,000 slow clients used to exhaust
    file descriptors and take /healthz down)."""
    processor = Processor(config(tmp_path, max_connections=20))

    async def scenario(client):
        port = client.server.port
        idle = [raw_connection(port) for _ in range(60)]
        try:
            guard = client.server.app[GUARD_KEY]
            for _ in range(200):  # until the server has accepted all 60
                if guard.evicted + guard.refused >= 40:
                    break
                await asyncio.sleep(0.05)
            assert len(client.server.runner.server.connections) <= 20
            assert (await client.get("/healthz")).status == 200
            assert (await post(client, ndjson_gz(kernel_batch(0, T0 + 1000)))).status == 200
            assert guard.evicted >= 40
        finally:
            for sock in idle:
                sock.close()

    run(processor, scenario)


def test_repeated_log_messages_are_rate_limited():
    """The same message (with its traceback) logged 10,000 times in a burst reaches the
    handler a few times, and the next one that passes says how many were held."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    handler = Keep()
    now = [0.0]
    limit = RateLimit(interval_s=10.0, burst=3, clock=lambda: now[0])
    handler.addFilter(limit)
    log = logging.getLogger("argus-test-flood")
    log.addHandler(handler)
    log.propagate = False
    try:
        for _ in range(10_000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                log.exception("socket.accept() out of system resource")
        now[0] = 10.5  # the interval is over
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            log.exception("socket.accept() out of system resource")
    finally:
        log.removeHandler(handler)
    assert len(seen) == 4 and limit.suppressed == 9_997
    assert seen[-1].getMessage().endswith("(9997 similar suppressed)")


def test_the_service_logs_through_the_rate_limit():
    """``argus processor`` puts every log handler behind the rate limit (a fresh logger stands
    in for the root one here, so the test leaves pytest's own handlers alone)."""
    root = logging.Logger("stand-in-root")
    limit = configure_logging(root=root)
    (handler,) = root.handlers
    assert limit in handler.filters and root.level == logging.INFO
    other = logging.StreamHandler()
    root.addHandler(other)
    assert configure_logging(limit=limit, root=root) is limit and limit in other.filters


# --------------------------------------------------------------------------- small ones (item 10)


def test_the_bearer_scheme_is_case_insensitive(tmp_path):
    """``Authorization: bearer TOKEN`` is the same credential as ``Bearer TOKEN``."""
    processor = Processor(config(tmp_path, token="s3cret"))

    async def scenario(client):
        body = ndjson_gz(kernel_batch(0, T0 + 1000))
        for scheme in ("bearer", "BEARER", "Bearer"):
            assert (await post(client, body, Authorization=f"{scheme} s3cret")).status == 200
        assert (await post(client, body, Authorization="bearer wrong")).status == 401
        assert (await post(client, body, Authorization="Basic s3cret")).status == 401

    run(processor, scenario)


def test_late_items_are_counted_by_kind(tmp_path):
    """``late_kernels`` counts only kernels; late steps and stack samples have their own."""
    processor = Processor(config(tmp_path))
    processor.recover()
    assert processor.ingest(ndjson_gz(kernel_batch(0, T0 + 1000, n=10)), "gzip").status == 200
    for future in processor.close_due(everything=True):
        future.result(10)
    late = ndjson_gz(kernel_batch(0, T0 + 2000, n=6), step(0, T0 + 3000), step(0, T0 + 4000),
                     stack(0, T0 + 5000))
    answer = processor.ingest(late, "gzip")
    assert answer.body == {"accepted": 4, "rejected": 0, "late_kernels": 6, "late_steps": 2,
                           "late_stacks": 1}
    processor.close()


def test_a_missing_bucket_is_said_at_start_and_on_readyz(tmp_path, s3_no_bucket, caplog):
    """A processor whose bucket does not exist says so in its log and on /readyz (it used to
    start silently and spool for ever); once the bucket exists it is ready."""
    processor = Processor(config(tmp_path).__class__(
        store=s3_no_bucket.url("traces"), spool_dir=str(tmp_path / "spool")))
    readiness = []

    async def scenario(client):
        ready = await client.get("/readyz")
        readiness.append((ready.status, await ready.json()))
        s3_no_bucket.create_bucket()
        await asyncio.get_running_loop().run_in_executor(None, processor.check_store)
        readiness.append(((await client.get("/readyz")).status, None))

    with caplog.at_level(logging.WARNING, logger="argus_core.processor"):
        run(processor, scenario)
    assert "does not exist" in caplog.text and s3_no_bucket.bucket in caplog.text
    (status, answer), (later, _) = readiness
    assert status == 503 and "does not exist" in " ".join(answer["reasons"])
    assert later == 200


# --------------------------------------------------------------------------- exposition (item 1)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is not installed (Debian package prometheus; CI has it)")
def test_exposition_after_several_jobs_passes_promtool(tmp_path):
    """What Prometheus scrapes after the processor served several jobs is valid text
    exposition by Prometheus's own checker."""
    processor = Processor(config(tmp_path))
    text = {}

    async def scenario(client):
        for job in ("llm", "vision", "rl"):
            records = [{"v": 1, "kind": "rank", "job": job, "rank": r, "world_size": 2,
                        "host": f"node-{r}"} for r in (0, 1)]
            records += [kernel_batch(r, T0 + 1000, job=job) for r in (0, 1)]
            assert (await post(client, ndjson_gz(*records))).status == 200
        for future in processor.close_due(everything=True):
            await asyncio.wrap_future(future)
        text["body"] = await (await client.get("/metrics")).text()

    run(processor, scenario)
    check = subprocess.run(["promtool", "check", "metrics"], input=text["body"].encode(),
                           capture_output=True, timeout=60)
    report = check.stdout.decode() + check.stderr.decode()
    # Exit 1: the text does not parse (a repeated HELP made Prometheus drop the whole scrape).
    # Exit 3: it parses, with lint findings; the one accepted is the documented design of
    # argus_kernel_duration_seconds, a gauge per quantile (DESIGN.md) rather than a summary.
    known = 'argus_kernel_duration_seconds non-summary metrics should not have "quantile" label'
    assert check.returncode in (0, 3), report
    assert all(line == known for line in report.splitlines() if line.strip()), report
    jobs = {s.labels["job"] for s in families(text["body"])["argus_kernel_executions"].samples}
    assert jobs == {"llm", "vision", "rl"}


@pytest.mark.parametrize(("setting", "value"), [
    ("window_s", float("nan")), ("grace_s", float("nan")), ("max_skew_s", float("inf")),
    ("max_age_s", float("nan")), ("wal_sync_interval_s", float("nan")),
    ("read_timeout_s", float("nan")), ("idle_timeout_s", float("inf")),
    ("state_ttl_s", float("nan")),
])
def test_settings_that_are_not_finite_are_refused_by_name(setting, value):
    """NaN passes every `<= 0` check; a processor started with `--read-timeout nan` or
    `--window nan` must refuse at start, naming the setting, not fail later or never time out."""
    from argus_core.processor.config import ProcessorConfig

    with pytest.raises(ValueError, match=setting):
        ProcessorConfig(**{setting: value}).validate()


def test_a_listen_port_past_65535_is_refused_by_the_command(tmp_path, capsys):
    """`argus processor --listen 127.0.0.1:99999` exits 2 naming --listen (was a traceback)."""
    from argus_core.cli import main

    code = main(["processor", "--listen", "127.0.0.1:99999", "--spool", str(tmp_path / "s"),
                 "--store", f"file://{tmp_path / 'store'}"])
    assert code == 2
    assert "--listen '127.0.0.1:99999'" in capsys.readouterr().err


@pytest.mark.parametrize("peers", [0, 16, 4096])
def test_a_step_records_estimate_covers_what_it_holds(peers):
    """The memory budget counts a step record at least at the bytes it takes once parsed,
    however many (phase, peer) entries it names (the schema allows 4,096)."""
    import tracemalloc

    from argus_core.processor.memory import step_bytes
    from argus_core.schema import parse_record

    record = {"v": 1, "kind": "step", "job": "j", "rank": 0, "step": 1, "t_ns": 10**18,
              "wall_s": 1.0, "phases": {f"phase-{i}": 0.001 for i in range(64)}}
    record["phases"]["pp-send"] = 1.0
    if peers:
        record["peers"] = {"pp-send": {str(i): {"s": 1e-4, "n": 1, "min_s": 1e-4}
                                       for i in range(1, peers + 1)}}
    tracemalloc.start()
    try:
        parsed = parse_record(record)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert step_bytes(parsed) >= held
