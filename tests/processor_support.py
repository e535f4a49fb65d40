"""Helpers for the processor's tests: Vector-format bodies, reading Perfetto files back, the
service in-process on a real loopback port (``run``) or as its own process
(``start_processor``)."""

from __future__ import annotations

import asyncio
import atexit
import gzip
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import orjson
from aiohttp.test_utils import TestClient, TestServer
from support import free_port

from argus_core.processor.service import (
    Processor,
    ProcessorConfig,
    build_app,
    protect,
    server_options,
)

W = 60_000_000_000
T0 = (time.time_ns() // W - 30) * W  # a whole minute, half an hour ago


def kernel_batch(rank: int, start: int, n: int = 400, job: str = "llm", seed: int = 0) -> dict:
    rng = np.random.default_rng(seed + rank)
    name = rng.integers(0, 3, n)
    return {"v": 1, "kind": "kernels", "job": job, "rank": rank,
            "names": ["sm90_gemm", "flash_fwd", "ncclDevKernel_AllReduce"],
            "name": name.tolist(), "stream": np.where(name == 2, 13, 7).tolist(),
            "start_ns": (start + np.arange(n) * 1_000_000).tolist(),  # 1 ms apart: no overlap
            "dur_ns": (rng.lognormal(np.log(5e4), 0.2, n) * (1 + 9 * (name == 2))).astype(
                int).tolist()}


def ndjson_gz(*records: dict) -> bytes:
    return gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in records))


def slices_in(trace_gz: bytes) -> list[tuple[int, int, str]]:
    """(start, end, name) of every kernel slice in a Perfetto file, parsed with its protos."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace.FromString(gzip.decompress(trace_gz))
    names: dict[int, str] = {}
    tracks: dict[int, str] = {}
    open_slices: dict[int, list[tuple[int, str]]] = {}
    out = []
    for packet in trace.packet:
        if packet.HasField("track_descriptor"):
            tracks[packet.track_descriptor.uuid] = packet.track_descriptor.name
        for entry in packet.interned_data.event_names:
            names[entry.iid] = entry.name
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        if not tracks.get(event.track_uuid, "").startswith("stream"):
            continue
        name = names.get(event.name_iid, event.name)
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_slices.setdefault(event.track_uuid, []).append((packet.timestamp, name))
        elif event.type == TrackEvent.TYPE_SLICE_END:
            start, name = open_slices[event.track_uuid].pop()
            out.append((start, packet.timestamp, name))
    return sorted(out)


def named_events(trace_gz: bytes) -> set[str]:
    """Names of the non-kernel events of a Perfetto file, and its process name."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    names = set()
    for packet in Trace.FromString(gzip.decompress(trace_gz)).packet:
        if packet.HasField("track_event") and packet.track_event.HasField("name"):
            names.add(packet.track_event.name)
        if packet.track_descriptor.HasField("process"):
            names.add(packet.track_descriptor.process.process_name)
    return names


def expected_slices(*batches: dict) -> list[tuple[int, int, str]]:
    return sorted((s, s + d, b["names"][n]) for b in batches
                  for s, d, n in zip(b["start_ns"], b["dur_ns"], b["name"], strict=True))


def config(tmp_path: Path, **overrides) -> ProcessorConfig:
    settings = {"window_s": 60, "grace_s": 5, **overrides}
    return ProcessorConfig(store=f"file://{tmp_path}/store", spool_dir=str(tmp_path / "spool"),
                           **settings)


def run(processor: Processor, scenario) -> None:
    """Run ``scenario(client)`` against the app on a real loopback port, then shut down."""
    async def main():
        server = TestServer(build_app(processor))
        await server.start_server(**server_options(processor.config))  # as serve() runs
        protect(server.app, server.runner.server)
        client = TestClient(server)
        await client.start_server()
        await asyncio.get_running_loop().run_in_executor(None, processor.recovered.wait, 30)
        try:
            await scenario(client)
        finally:
            await client.close()  # runs on_shutdown: the drain

    asyncio.run(main())


def post(client, body: bytes, **headers):
    return client.post("/v1/records", data=body,
                       headers={"Content-Type": "application/x-ndjson",
                                "Content-Encoding": "gzip", **headers})


_STARTED: list[subprocess.Popen] = []


@atexit.register
def _kill_leftovers() -> None:
    """A test that failed midway must not leave its processor running after the session."""
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()


def start_processor(tmp_path: Path, store: str, env: dict | None = None, *args: str) -> tuple:
    """``argus processor`` as its own process; returns (process, port) once it has replayed
    its log and takes records."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "argus_core.cli", "processor", "--listen", f"127.0.0.1:{port}",
         "--store", store, "--spool", str(tmp_path / "spool"), "--window", "60",
         "--grace", "1", *args], env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    _STARTED.append(proc)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return proc, port
        except urllib.error.HTTPError as exc:  # not ready: fine unless still replaying
            if "recovering" not in exc.read().decode():
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(proc.stdout.read().decode())


def http_post(port: int, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/records", data=body,
                                     headers={"Content-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


