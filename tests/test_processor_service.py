"""The processor over real HTTP: Vector-format bodies in, /metrics summaries and Perfetto files
out (local directory and a real moto S3), bad input, backpressure, auth, SIGTERM drain, and an
S3 outage mid-run."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import orjson
import pytest
from processor_support import (
    T0,
    W,
    config,
    expected_slices,
    http_post,
    kernel_batch,
    named_events,
    ndjson_gz,
    post,
    run,
    slices_in,
    start_processor,
)
from prometheus_client.parser import text_string_to_metric_families

from argus_core.processor.service import Processor
from argus_core.processor.store import open_store, parse_key
from argus_core.schema import parse_record
from argus_core.summaries import summarize_kernels
from argus_core.trace import TraceBuilder


@pytest.mark.parametrize("chunk_events", [65_536, 150])
def test_posted_kernels_come_out_as_summaries_and_exact_perfetto_files(tmp_path, chunk_events):
    """Two ranks' kernels in Vector's body format: /metrics shows their cluster summaries and
    each (rank, window) Perfetto file holds exactly the posted kernels, whether a window is
    written at once or chunk by chunk."""
    processor = Processor(config(tmp_path, chunk_events=chunk_events))
    batches = [kernel_batch(r, T0 + 1000 + i * 1_000_000_000, seed=i) for r in (0, 1)
               for i in range(3)]
    late = [kernel_batch(r, T0 + W + 6_000_000_000, n=10) for r in (0, 1)]  # closes window 0
    metrics = {}

    async def scenario(client):
        rank = {"v": 1, "kind": "rank", "job": "llm", "rank": 0, "world_size": 2,
                "host": "node-3", "coords": {"dp": 0}}
        step = {"v": 1, "kind": "step", "job": "llm", "rank": 0, "step": 41, "t_ns": T0 + 500,
                "wall_s": 0.5, "gpu_s": 0.4, "phases": {"forward": 0.1, "backward": 0.2}}
        stack = {"v": 1, "kind": "stack", "job": "llm", "rank": 0, "t_ns": T0 + 900,
                 "thread": "MainThread", "frames": ["train.py:main:10", "model.py:fwd:3"]}
        response = await post(client, ndjson_gz(rank, step, stack, *batches))
        assert response.status == 200
        assert await response.json() == {"accepted": 9, "rejected": 0}
        response = await post(client, ndjson_gz(*late))
        assert response.status == 200
        processor.close_due()
        for _ in range(100):
            if processor.stats.windows_written >= 2:
                break
            await asyncio.sleep(0.05)
        response = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert response.headers["Content-Encoding"] == "gzip"  # as Prometheus scrapes it
        text = await response.text()
        metrics.update({f.name: f for f in text_string_to_metric_families(text)})

    run(processor, scenario)
    quantiles = metrics["argus_kernel_duration_seconds"].samples
    ranks = {s.labels["rank"] for s in quantiles}
    kernels = {s.labels["kernel"] for s in quantiles}
    assert ranks == {"0", "1"} and kernels == {"sm90_gemm", "flash_fwd",
                                                "ncclDevKernel_AllReduce"}
    executions = sum(s.value for s in metrics["argus_kernel_executions"].samples)
    assert executions == sum(len(b["name"]) for b in batches)
    info = metrics["argus_rank_info"].samples[0].labels
    assert info["host"] == "node-3"
    store = open_store(f"file://{tmp_path}/store")
    files = {parse_key(o.key).rank: o.key for o in store.list()
             if parse_key(o.key).window_start_ns == T0}
    assert set(files) == {0, 1}
    for rank in (0, 1):
        got = slices_in(store.get(files[rank]))
        assert got == expected_slices(*[b for b in batches if b["rank"] == rank])
    events = named_events(store.get(files[0]))
    assert {"step 41", "forward", "backward", "model.py:fwd:3"} <= events
    assert "rank 0 (node-3)" in events
    assert processor.stats.kernel_events_written == sum(len(b["name"]) for b in [*batches, *late])
    # The online summaries are the offline ones (argus diagnose's) of the same kernels.
    builder = TraceBuilder()
    for batch in batches[:3]:  # rank 0's
        builder.add(parse_record(batch))
    offline = summarize_kernels(builder.finish()["llm"].kernels)
    online = sorted((s.labels["kernel"], s.labels["quantile"], s.value) for s in quantiles
                    if s.labels["rank"] == "0")
    expected = sorted((offline.names[k], q, v * 1e-9) for k, p50, p99 in zip(
        offline.kernel, offline.p50_ns, offline.p99_ns, strict=True)
        for q, v in (("0.5", p50), ("0.99", p99)))
    assert [(k, q) for k, q, _ in online] == [(k, q) for k, q, _ in expected]
    np.testing.assert_allclose([v for *_, v in online], [v for *_, v in expected], rtol=1e-9)


def test_metrics_of_several_jobs_are_one_family_per_name(tmp_path):
    """A host that served two jobs still exposes valid text: one HELP/TYPE per metric name
    (a repeated HELP makes Prometheus reject the whole scrape), every job's samples inside."""
    processor = Processor(config(tmp_path))
    text = {}

    async def scenario(client):
        for job in ("llm", "vision"):
            batches = [kernel_batch(r, T0 + 1000, job=job) for r in (0, 1)]
            late = [kernel_batch(r, T0 + W + 6_000_000_000, n=10, job=job) for r in (0, 1)]
            assert (await post(client, ndjson_gz(*batches, *late))).status == 200
        processor.close_due()
        for _ in range(100):
            if processor.stats.windows_written >= 4:
                break
            await asyncio.sleep(0.05)
        text["body"] = await (await client.get("/metrics")).text()

    run(processor, scenario)
    body = text["body"]
    for name in ("argus_kernel_duration_seconds", "argus_kernel_executions"):
        assert body.count(f"# HELP {name} ") == 1
        assert body.count(f"# TYPE {name} ") == 1
    families = {f.name: f for f in text_string_to_metric_families(body)}
    jobs = {s.labels["job"] for s in families["argus_kernel_executions"].samples}
    assert jobs == {"llm", "vision"}


def test_without_a_log_unfinished_windows_of_a_crashed_processor_are_salvaged(tmp_path):
    """With --durability memory (no log), a processor killed mid-window leaves its file in
    the spool: the next one uploads the chunks it had written."""
    from argus_core.processor.service import WINDOWS_DIR
    from argus_core.processor.store import trace_key
    from argus_core.processor.window_output import WindowOutput
    from argus_core.processor.windows import KernelChunk

    batch = kernel_batch(3, T0 + 1000, n=300)
    key = trace_key("", "llm", 3, T0)
    output = WindowOutput(tmp_path / "spool" / WINDOWS_DIR, key, job="llm", rank=3,
                          window_start_ns=T0, window_ns=W)
    output.add(batch["names"], KernelChunk(np.array(batch["name"]), np.array(batch["stream"]),
                                           np.array(batch["start_ns"]),
                                           np.array(batch["dur_ns"])))
    del output  # the crash: no finish, the file stays behind

    processor = Processor(config(tmp_path, durability="memory"))
    processor.recover()
    assert processor.stats.salvaged_windows == 1
    processor.drain(timeout=10)
    store = open_store(f"file://{tmp_path}/store")
    got = slices_in(store.get(key))
    want = expected_slices(batch)
    # Each stream's newest kernel was still held back, unwritten, when the process died.
    assert len(got) == len(want) - 2 and set(got) <= set(want)
    assert not list((tmp_path / "spool" / WINDOWS_DIR).iterdir())


def test_json_array_bodies_zstd_and_partial_rejects(tmp_path):
    """A JSON array (codec json, no framing) in zstd is accepted; bad records get a 400 that
    names line/field and says how many were kept; the good ones are kept."""
    from backports import zstd

    processor = Processor(config(tmp_path))
    bad = kernel_batch(0, T0)
    bad["dur_ns"][3] = -7

    async def scenario(client):
        body = zstd.compress(orjson.dumps([kernel_batch(0, T0)]))
        response = await client.post("/v1/records", data=body,
                                      headers={"Content-Encoding": "zstd"})
        assert (response.status, (await response.json())["accepted"]) == (200, 1)
        response = await post(client, ndjson_gz(kernel_batch(1, T0), bad,
                                                {"v": 1, "kind": "mystery", "job": "llm",
                                                 "rank": 0}))
        answer = await response.json()
        assert response.status == 400
        assert answer["accepted"] == 1 and answer["rejected"] == 2
        assert answer["errors"] == ["line 2: dur_ns[3]: must be >= 0, got -7",
                                    "line 3: kind: unknown kind 'mystery' (known: rank, step, "
                                    "kernels, stack)"]

    run(processor, scenario)
    assert processor.stats.records_in == 2 and processor.stats.rejected == {"dur_ns": 1, "kind": 1}


def test_path_like_job_names_stay_inside_the_store(tmp_path):
    """A job named '../../etc' is stored under a safe key inside the store directory."""
    processor = Processor(config(tmp_path))

    async def scenario(client):
        assert (await post(client, ndjson_gz(kernel_batch(0, T0, job="../../etc")))).status \
            == 200

    run(processor, scenario)
    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].resolve().is_relative_to((tmp_path / "store").resolve())
    assert parse_key(files[0].relative_to(tmp_path / "store").as_posix()).job == "../../etc"


@pytest.mark.parametrize("headers, body, status", [
    ({"Content-Encoding": "br"}, b"x", 415),
    ({"Content-Encoding": "gzip"}, b"definitely not gzip", 400),
])
def test_bad_bodies_are_refused_and_the_service_goes_on(tmp_path, headers, body, status):
    """Undecodable bodies get a 4xx naming the problem; a good post afterwards still works."""
    processor = Processor(config(tmp_path))

    async def scenario(client):
        response = await client.post("/v1/records", data=body, headers=headers)
        assert response.status == status and "error" in await response.json()
        assert (await post(client, ndjson_gz(kernel_batch(0, T0)))).status == 200

    run(processor, scenario)


def test_oversized_body_is_413(tmp_path):
    """A decompressed body beyond the limit is refused, and counted."""
    processor = Processor(config(tmp_path, max_body_bytes=4096))

    async def scenario(client):
        response = await post(client, ndjson_gz(*[kernel_batch(0, T0)] * 5))
        assert response.status == 413

    run(processor, scenario)
    assert processor.stats.rejected["body"] == 1


def test_bearer_token(tmp_path):
    """With a token configured, a missing or wrong one is a 401; the right one passes."""
    processor = Processor(config(tmp_path, token="s3cret"))

    async def scenario(client):
        body = ndjson_gz(kernel_batch(0, T0))
        assert (await post(client, body)).status == 401
        assert (await post(client, body, Authorization="Bearer nope")).status == 401
        assert (await post(client, body, Authorization="Bearer s3cret")).status == 200

    run(processor, scenario)


def test_backpressure_answers_503_with_retry_after(tmp_path):
    """Past the memory budget: 503 + Retry-After, /readyz not ready and says why; /healthz
    stays ok; nothing refused was half-taken."""
    import threading

    processor = Processor(config(tmp_path, memory_budget_bytes=2 << 20))
    processor.recover()
    stalled = threading.Event()
    processor._writer.submit(stalled.wait)  # the writer is stuck (a slow disk)
    accepted = []

    async def scenario(client):
        try:
            for i in range(40):
                response = await post(client, ndjson_gz(kernel_batch(0, T0 + i, n=5000)))
                if response.status == 503:
                    break
                assert response.status == 200
                accepted.append(5000)
            assert response.status == 503 and response.headers["Retry-After"] == "1"
            assert "memory budget full" in (await response.json())["error"]
            ready = await client.get("/readyz")
            assert ready.status == 503 and "memory budget" in (await ready.json())["reasons"][0]
            assert (await client.get("/healthz")).status == 200
        finally:
            stalled.set()

    run(processor, scenario)
    assert 0 < sum(accepted) == processor.stats.kernel_events_written


def test_partly_filled_chunks_of_many_windows_never_wedge_intake(tmp_path):
    """Many windows each holding less than a chunk can add up to the budget: past half of it
    they are handed to the writer, so intake resumes instead of answering 503 until windows
    close."""
    processor = Processor(config(tmp_path, memory_budget_bytes=6 << 20, chunk_events=100_000))

    async def post_until_taken(client, body: bytes) -> None:
        for _ in range(250):  # 5 s at most: a wedged intake would answer 503 for 65 s
            response = await post(client, body)
            if response.status == 200:
                return
            assert response.status == 503
            await asyncio.sleep(0.02)  # the writer catches up; no window closes meanwhile
        raise AssertionError("intake stayed 503")

    async def scenario(client):
        for rank in range(8):  # 8 windows x 20,000 kernels: none has a chunk's worth
            await post_until_taken(client, ndjson_gz(kernel_batch(rank, T0, n=20_000)))
        await post_until_taken(client, ndjson_gz(kernel_batch(0, T0 + 25 * 10**9, n=20_000)))
        assert processor.stats.windows_written == 0  # taken without any window closing

    run(processor, scenario)
    assert processor.stats.kernel_events_written == 9 * 20_000


# -- the real service process ----------------------------------------------------------------
def test_sigterm_writes_every_open_window(tmp_path):
    """SIGTERM: open windows are closed, written and uploaded before the process exits."""
    proc, port = start_processor(tmp_path, f"file://{tmp_path}/store")
    batches = [kernel_batch(r, T0 + i * W, n=50) for r in range(3) for i in range(2)]
    assert http_post(port, ndjson_gz(*batches)) == 200
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, output
    assert "drained: windows=6 kernel_events_written=300" in output
    keys = [o.key for o in open_store(f"file://{tmp_path}/store").list()]
    assert len(keys) == 6


def test_s3_outage_mid_run_loses_no_window(tmp_path, s3):
    """S3 stops while windows are written: uploads spool; after S3 returns, every window's
    file is in the bucket with exactly its kernels."""
    env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                       "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    proc, port = start_processor(tmp_path, s3.url("traces"), env)
    first = [kernel_batch(r, T0, n=80) for r in range(2)]
    assert http_post(port, ndjson_gz(*first)) == 200
    s3.server.stop()
    later = [kernel_batch(r, T0 + W * i, n=80, seed=i) for r in range(2) for i in (1, 2)]
    assert http_post(port, ndjson_gz(*later)) == 200  # closes window 0 (and later, window 1)
    time.sleep(3)  # windows are written while S3 is down: they wait in the spool
    s3.server.start()
    s3.create_bucket()
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0, output
    objects = s3.objects()
    assert len(objects) == 2 * 3, output
    by_window = {}
    for key, data in objects.items():
        ref = parse_key(key)
        by_window[(ref.rank, ref.window_start_ns)] = data
    for batch in [*first, *later]:
        window = T0 + (batch["start_ns"][0] - T0) // W * W
        assert slices_in(by_window[(batch["rank"], window)]) == expected_slices(batch)
