"""Benchmark: one processor process under a loopback load of columnar kernel batches.

    python bench/processor.py [--seconds 30] [--ranks 8] [--modes memory,write,fsync] [--json]

For each durability mode (``--durability`` of ``argus processor``: ``write``, the default, acks
once a body is in the write-ahead log; ``fsync`` once it is also fsynced; ``memory`` keeps no
log, the baseline) the same load runs against a fresh processor, one after the other in the
same run; the last line carries every mode's numbers and the durable modes' ratios to
``memory`` (throughput, CPU per event, RSS). Each run: starts ``argus processor`` (file store
and spool in a temporary directory) as one process,
then posts gzip NDJSON bodies, each one ``kernels`` record of 10,000 kernels, round-robin over
--ranks ranks, with record time advancing 250 ms per batch (40,000 kernels/s per rank, a
busy GPU; 2.4 M kernels per rank per 60 s window), faster than wall time so windows keep
closing while the load runs. 503 answers are retried after Retry-After, as Vector does. At
the end the processor gets SIGTERM and drains. Fields: ``events_per_s`` (kernel events
accepted, compressed and written into Perfetto files, over the load's wall time plus the
drain: work still queued when the load stops is not free), ``accepted_per_s`` (acknowledged
events over the load's wall time alone), ``processor_cpu_ns_per_event`` (the processor's
CPU time, all threads, per event), ``rss_growth_mb`` (processor RSS at the end of the load
minus once every rank has written its first window), ``rss_max_mb`` and
``rss_slope_mb_per_min`` (RSS sampled every 200 posts after that), ``lost`` (acknowledged
events minus events written to Perfetto windows), plus how many files were written.
Bodies are built before the clock starts (``--live``: while posting, for soaks that would not
fit in memory), so the generator costs only the posting. Baselines measured in the same run:
the ``memory`` mode, and the same bodies posted to a server that only reads them, i.e. what
loopback HTTP and aiohttp themselves carry on this machine. Record time starts 23 hours
before the processor's clock (within its --max-age) and advances faster than wall time.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import orjson
from _report import report

from argus_core.stack.processes import free_port

BATCH = 10_000
STEP_NS = 250_000_000  # record time covered by one batch of one rank
T0 = (time.time_ns() // 60_000_000_000 - 23 * 60) * 60_000_000_000  # 23 h ago, whole minute
NAMES = [f"sm90_xmma_gemm_{i}" for i in range(40)] + [f"ncclDevKernel_AllReduce_{i}"
                                                      for i in range(8)]


class Bodies:
    """Request bodies: one gzip NDJSON ``kernels`` record of BATCH kernels each.

    Kernel names, streams, durations and start offsets come from a pool of pre-drawn
    columns, so making a body costs one JSON encode and one gzip (about 1 ms): fast enough
    to build bodies while posting in long soaks without the generator setting the rate.
    """

    def __init__(self, pool: int = 32, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.pool = []
        for _ in range(pool):
            name = rng.integers(0, len(NAMES), BATCH).astype(np.int32)
            dur = (np.exp(rng.normal(np.log(2e4), 0.5, BATCH)) * (1 + 4 * (name >= 40))).astype(
                np.int64)
            offset = np.sort(rng.integers(0, STEP_NS, BATCH))
            stream = np.where(name >= 40, 13, 7).astype(np.int64)
            self.pool.append((name, stream, offset, dur))
        self.made = 0

    def body(self, rank: int, t_ns: int) -> bytes:
        """One body for ``rank`` whose kernels start within STEP_NS of ``t_ns``."""
        name, stream, offset, dur = self.pool[self.made % len(self.pool)]
        self.made += 1
        record = {"v": 1, "kind": "kernels", "job": "bench", "rank": rank, "names": NAMES,
                  "name": name, "stream": stream, "start_ns": offset + t_ns, "dur_ns": dur}
        return _gzip(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def _gzip(data: bytes) -> bytes:
    try:
        from isal import isal_zlib
    except ImportError:
        return gzip.compress(data, 1)
    compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_ready(port: int, timeout: float = 60, path: str = "/readyz") -> None:
    """Wait until ``path`` answers 200 (the processor has replayed its log)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("processor did not start")


def make_bodies(seconds: float, ranks: int, rate: float = 2.5e6) -> list[tuple[int, bytes]]:
    """Bodies for the whole run, built before timing starts (enough for ``rate`` events/s),
    so the load generator is not what is measured."""
    bodies = list(itertools.islice(live_bodies(ranks), int(seconds * rate / BATCH) + ranks))
    return bodies


def live_bodies(ranks: int):
    """Bodies round robin over the ranks, each rank's record time advancing STEP_NS a body."""
    factory = Bodies()
    t_ns = [T0] * ranks
    i = 0
    while True:
        rank = i % ranks
        yield rank, factory.body(rank, t_ns[rank])
        t_ns[rank] += STEP_NS
        i += 1


def load(port: int, seconds: float, ranks: int, bodies,
         path: str = "/v1/records") -> dict:
    """Post the prepared bodies for ``seconds`` (or until they run out)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
    acked = retries = posts = 0
    rss_warm = held_warm = None
    samples: list[tuple[float, float, float]] = []  # (seconds, RSS bytes, held events)
    start = time.perf_counter()
    for _, body in bodies:
        if time.perf_counter() - start >= seconds:
            break
        while True:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 503:
                break
            retries += 1
            time.sleep(float(response.getheader("Retry-After", "1")))
        if response.status == 200:
            acked += BATCH
        posts += 1
        if path != "/sink" and posts % 200 == 0:
            metrics = scrape(port)
            if rss_warm is not None:
                samples.append((time.perf_counter() - start,
                                metrics.get("process_resident_memory_bytes", 0),
                                metrics.get("argus_processor_buffered_kernel_events", 0)))
            elif metrics.get("argus_processor_windows_written_total", 0) >= ranks:
                # warm once every rank has written a window
                rss_warm = metrics.get("process_resident_memory_bytes", 0)
                held_warm = metrics.get("argus_processor_buffered_kernel_events", 0)
    elapsed = time.perf_counter() - start
    end = scrape(port) if path != "/sink" else {}
    return {"acked": acked, "posts": posts, "retries": retries, "seconds": elapsed,
            "rss_samples": samples,
            "rss_warm": rss_warm, "rss_end": end.get("process_resident_memory_bytes", 0),
            "held_warm": held_warm,
            "held_end": end.get("argus_processor_buffered_kernel_events", 0)}


def baseline(seconds: float, ranks: int) -> float:
    """Events/s the generator and loopback HTTP carry to a server that only reads bodies."""
    from aiohttp import web

    port = free_port()
    code = (
        "from aiohttp import web\n"
        "async def sink(r):\n    await r.read()\n    return web.Response(text='ok')\n"
        "app = web.Application(client_max_size=1 << 26)\n"
        "app.router.add_post('/sink', sink)\n"
        "app.router.add_get('/healthz', lambda r: web.Response(text='ok'))\n"
        f"web.run_app(app, host='127.0.0.1', port={port}, print=None)\n")
    del web
    server = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_ready(port, path="/healthz")
        result = load(port, seconds, ranks, make_bodies(seconds, ranks, 5e6), path="/sink")
    finally:
        server.terminate()
        server.wait(10)
    return result["acked"] / result["seconds"]


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    """One processor with ``--durability mode`` under the load; its numbers."""
    bodies = live_bodies(args.ranks) if args.live else make_bodies(args.seconds, args.ranks)
    work = tempfile.mkdtemp(prefix="argus-bench-")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "argus_core.cli", "processor",
                             "--listen", f"127.0.0.1:{port}", "--store", f"file://{work}/store",
                             "--spool", f"{work}/spool", "--durability", mode,
                             *args.processor_args.split()], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(port)
        result = load(port, args.seconds, args.ranks, bodies)
        before_drain = scrape(port)
        cpu_s = _cpu_seconds(proc.pid)
        drain_start = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
        drain_s = time.perf_counter() - drain_start
    finally:
        if proc.poll() is None:
            proc.kill()
    files = [os.path.join(d, f) for d, _, fs in os.walk(f"{work}/store") for f in fs]
    written = _kernels_written(err.decode(errors="replace"))
    shutil.rmtree(work, ignore_errors=True)
    total_s = result["seconds"] + drain_s
    return {"seconds": result["seconds"], "drain_s": drain_s, "posted_events": result["acked"],
            "events_per_s": (written or 0) / total_s,
            "accepted_per_s": result["acked"] / result["seconds"],
            "processor_cpu_ns_per_event": cpu_s / max(result["acked"], 1) * 1e9,
            "rss_growth_mb": (result["rss_end"] - result["rss_warm"]) / 2**20
            if result["rss_warm"] else None,
            "rss_warm_mb": (result["rss_warm"] or 0) / 2**20,
            "held_events_warm": result["held_warm"], "held_events_end": result["held_end"],
            "rss_end_mb": result["rss_end"] / 2**20,
            **_rss_trend(result["rss_samples"]),
            "wal_mb_end_of_load": before_drain.get("argus_processor_wal_bytes", 0) / 2**20,
            "lost": result["acked"] - written if written is not None else None,
            "events_written": written, "files": len(files), "retries_503": result["retries"],
            "accepted_before_drain": before_drain.get("argus_processor_kernel_events_total")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--modes", default="memory,write,fsync",
                        help="durability modes to run, in this order (memory is the baseline)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the modes this many times, interleaved; report the median")
    parser.add_argument("--live", action="store_true",
                        help="build bodies while posting (soak runs; slower generator)")
    parser.add_argument("--processor-args", default="",
                        help="extra arguments for argus processor (e.g. '--chunk-events 65536')")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(args.repeat):  # interleaved: a noisy neighbour hits every mode alike
        for mode in modes:
            runs[mode].append(run_mode(mode, args))
    results = {mode: _median_run(rs) for mode, rs in runs.items()}
    base = baseline(15, args.ranks) if not args.live else None
    out: dict = {"repeat": args.repeat}
    for mode, rs in runs.items():
        out[f"{mode}_events_per_s_each"] = [round(r["events_per_s"]) for r in rs]
    for mode, result in results.items():
        out.update({f"{mode}_{key}": value for key, value in result.items()})
    reference = results.get("memory")
    for mode, result in results.items():
        if reference is not None and mode != "memory":
            out[f"{mode}_vs_memory_events_per_s"] = (result["events_per_s"]
                                                     / reference["events_per_s"])
            out[f"{mode}_vs_memory_cpu_per_event"] = (result["processor_cpu_ns_per_event"]
                                                      / reference["processor_cpu_ns_per_event"])
            out[f"{mode}_vs_memory_rss_end"] = result["rss_end_mb"] / reference["rss_end_mb"]
            if result["rss_max_mb"] and reference["rss_max_mb"]:
                out[f"{mode}_vs_memory_rss_max"] = result["rss_max_mb"] / reference["rss_max_mb"]
        if base:
            out[f"{mode}_ratio_to_loopback"] = result["events_per_s"] / base
    out["baseline_loopback_events_per_s"] = base
    report(out, args.json)
    return 0


def _median_run(runs: list[dict]) -> dict:
    """The run whose events_per_s is the median of the runs."""
    return sorted(runs, key=lambda r: r["events_per_s"])[len(runs) // 2]


def _rss_trend(samples: list[tuple[float, float, float]]) -> dict:
    """Highest RSS after warm-up and least-squares slopes (MB per minute) of RSS and of RSS
    less the kernel events held (28 B each: what the writer's queue accounts for)."""
    if len(samples) < 3:
        return {"rss_max_mb": None, "rss_slope_mb_per_min": None, "rss_samples": len(samples)}
    t, rss, held = (np.array(c, dtype=np.float64) for c in zip(*samples, strict=True))
    slope = np.polyfit(t, rss / 2**20, 1)[0] * 60
    beyond_held = np.polyfit(t, (rss - 28 * held) / 2**20, 1)[0] * 60
    return {"rss_max_mb": float(rss.max()) / 2**20, "rss_slope_mb_per_min": float(slope),
            "rss_less_held_slope_mb_per_min": float(beyond_held), "rss_samples": len(samples)}


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kernels_written(log: str) -> int | None:
    """The processor logs its totals when it has drained; read them back."""
    for line in reversed(log.splitlines()):
        if "drained:" in line and "kernel_events_written=" in line:
            return int(line.split("kernel_events_written=")[1].split()[0])
    return None


if __name__ == "__main__":
    sys.exit(main())
