"""Soak: one processor under a mixed load, slow-loris clients alongside, SIGKILLed midway.

    python bench/processor_soak.py [--seconds 180] [--loris 300] [--hostile] [--json]

What runs, all on loopback against one ``argus processor`` (default durability, file store):

- jobs come and go: a new job every ``--job-every`` seconds, each with ``--ranks`` ranks that
  send their identity, then every ~0.3 s a body with a kernels batch (``--kernels`` kernels,
  record time = now), a step record and, every other time, a stack sample, for
  ``--job-life`` seconds; two posting threads share the ranks, retrying 503s, timeouts and
  refused connections with the same body (at-least-once, as Vector does);
- ``--loris`` slow-loris connections trickle a byte every 2 s into request headers or a
  request body, and reconnect when the processor cuts them off;
- a prober asks ``/healthz`` every 50 ms on a fresh connection and records the latency;
- the processor's RSS is read from /proc every second;
- halfway, the processor gets SIGKILL and a new one starts on the same spool (it replays the
  write-ahead log); at the end, SIGTERM and drain.

- with ``--hostile``, beside that load: every ~2 s a 78 KB body spreading kernels of 20
  ranks over a day (28,600 windows: it must be refused whole), four concurrent 24 MB chunked
  bodies, four /metrics requests that never read their answer and one real scrape (its
  seconds and size); and once, a ``--wide-ranks`` (10,000) rank job whose kernel summaries
  then fill /metrics. The processor's file descriptors are counted every second.

Then every Perfetto file in the store is read back and, per (job, rank), the kernels, steps and
stack samples in the files are compared with what was acknowledged (accepted minus what the
answers said was late). ``lost`` must be 0; ``duplicates`` counts items written twice because
a body was retried after the kill without its answer having arrived (at-least-once).

Fields: ``healthz_p50_ms``/``p99``/``max`` and ``healthz_failures`` (excluding the seconds the
processor was down); ``rss_mb_first_half_max`` and ``rss_mb_second_half_max`` (after each
start's first 20 s) and ``rss_slope_mb_per_min`` over the second half; ``recovery_s`` (SIGKILL
to ready again); the acknowledged and written counts; slow-loris connections cut off by the
processor. Before the load, one ``--big-body-mb`` (60) MB NDJSON body is posted while /healthz is
probed every 10 ms (``big_body_healthz_*``: a 63 MB body used to block /healthz for 4.5 s).
Baseline in the same run: the first half's RSS (before the kill) against the second half's,
and /healthz latency of an idle processor measured before the load starts.

One script past 500 lines on purpose: the load, the slow-loris clients, the kill and the
probes of /healthz and RSS run together, on one clock.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import orjson
from _report import report
from processor import free_port

NAMES = [f"sm90_xmma_gemm_{i}" for i in range(24)] + [f"ncclDevKernel_AllReduce_{i}"
                                                      for i in range(4)]


class Processor:
    """The processor process: start (waits until ready), SIGKILL, SIGTERM, RSS."""

    def __init__(self, work: Path, args: argparse.Namespace):
        self.work = work
        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.log = open(work / "processor.log", "ab")  # noqa: SIM115 - lives with the soak

    def start(self) -> float:
        """Start and wait until /readyz says ready; returns the seconds it took."""
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "argus_core.cli", "processor", "--listen",
             f"127.0.0.1:{self.port}", "--store", f"file://{self.work}/store", "--spool",
             str(self.work / "spool"), "--window", "20", "--grace", "3", "--state-ttl", "60",
             "--max-connections", str(self.args.max_connections), "--read-timeout", "5",
             "--idle-timeout", "10", *self.args.processor_args.split()],
            stdout=self.log, stderr=self.log, env={**os.environ, "OMP_NUM_THREADS": "1"})
        while time.monotonic() - started < 300:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2)
                return time.monotonic() - started
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("processor did not become ready")

    def rss_mb(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            return None
        return None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(600)


class Ledger:
    """What was acknowledged, per (job, rank) and kind; thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acked: dict[tuple[str, int], Counter] = defaultdict(Counter)
        self.hosts: dict[tuple[str, int], str] = {}
        self.posts = self.retries = self.refused = 0

    def add(self, key: tuple[str, int], sent: Counter, answer: dict) -> None:
        with self.lock:
            self.posts += 1
            for kind in ("kernels", "steps", "stacks"):
                self.acked[key][kind] += sent[kind] - answer.get(f"late_{kind}", 0)
                self.acked[key][f"late_{kind}"] += answer.get(f"late_{kind}", 0)


class Rank:
    """One rank of one job: builds its bodies (record time = now)."""

    def __init__(self, job: str, rank: int, kernels: int, seed: int):
        self.job, self.rank, self.kernels = job, rank, kernels
        self.rng = np.random.default_rng(seed)
        self.step = 0
        self.identified = False

    def body(self) -> tuple[bytes, Counter]:
        now = time.time_ns()
        records: list[dict] = []
        sent: Counter = Counter()
        if not self.identified:
            records.append({"v": 1, "kind": "rank", "job": self.job, "rank": self.rank,
                            "world_size": 64, "host": f"node-{self.rank // 8}",
                            "local_rank": self.rank % 8, "coords": {"dp": self.rank}})
            self.identified = True
        n = self.kernels
        name = self.rng.integers(0, len(NAMES), n)
        start = now - 300_000_000 + np.sort(self.rng.integers(0, 290_000_000, n))
        dur = self.rng.integers(2_000, 40_000, n)
        records.append({"v": 1, "kind": "kernels", "job": self.job, "rank": self.rank,
                        "names": NAMES, "name": name, "stream": np.where(name >= 24, 13, 7),
                        "start_ns": start, "dur_ns": dur})
        records.append({"v": 1, "kind": "step", "job": self.job, "rank": self.rank,
                        "step": self.step, "t_ns": now - 300_000_000, "wall_s": 0.3,
                        "gpu_s": 0.28, "phases": {"forward": 0.1, "backward": 0.15,
                                                  "dp-allreduce": 0.03}})
        sent.update(kernels=n, steps=1)
        if self.step % 2 == 0:
            records.append({"v": 1, "kind": "stack", "job": self.job, "rank": self.rank,
                            "t_ns": now - 150_000_000, "thread": "MainThread",
                            "frames": ["train.py:main:10", "train.py:step:42",
                                       f"model.py:block:{self.step % 7}"]})
            sent.update(stacks=1)
        self.step += 1
        data = b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
                        for r in records)
        return gzip.compress(data, 1), sent


def post_until_answered(processor: Processor, body: bytes, stop: threading.Event,
                        ledger: Ledger) -> dict | None:
    """Post one body until it gets a 2xx (503, errors and a dead processor: retry)."""
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", processor.port, timeout=30)
            conn.request("POST", "/v1/records", body=body,
                         headers={"Content-Encoding": "gzip",
                                  "Content-Type": "application/x-ndjson"})
            response = conn.getresponse()
            data = response.read()
            conn.close()
        except (OSError, http.client.HTTPException):
            with ledger.lock:
                ledger.refused += 1
            time.sleep(0.1)
            continue
        if response.status == 200:
            return orjson.loads(data)
        if response.status == 503:
            with ledger.lock:
                ledger.retries += 1
            time.sleep(float(response.getheader("Retry-After", "1")) * random.uniform(0.5, 1))
            continue
        raise RuntimeError(f"unexpected {response.status}: {data[:300]!r}")
    return None


def poster(processor: Processor, ranks: list[Rank], lock: threading.Lock,
           stop: threading.Event, ledger: Ledger, period_s: float) -> None:
    """Post a body for every live rank each period, oldest ranks first."""
    while not stop.is_set():
        started = time.monotonic()
        with lock:
            mine = list(ranks)
        for rank in mine:
            body, sent = rank.body()
            answer = post_until_answered(processor, body, stop, ledger)
            if answer is not None:
                ledger.add((rank.job, rank.rank), sent, answer)
        time.sleep(max(0.0, period_s - (time.monotonic() - started)))


def slow_loris(processor: Processor, count: int, stop: threading.Event, stats: Counter) -> None:
    """Keep ``count`` connections trickling a byte every 2 s; reconnect when cut off."""
    socks: dict[socket.socket, bytes] = {}

    def connect() -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", processor.port), timeout=2)
        except OSError:
            stats["connect_failed"] += 1
            return
        sock.setblocking(False)
        if random.random() < 0.5:  # stall in the headers
            rest = b"POST /v1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n"
        else:  # complete headers, stall in the body
            with contextlib.suppress(OSError):
                sock.sendall(b"POST /v1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 999"
                             b"\r\nContent-Encoding: identity\r\n\r\n")
            rest = b"{" * 999
        socks[sock] = rest
        stats["opened"] += 1

    while not stop.is_set():
        while len(socks) < count and not stop.is_set():
            connect()
        readable, _, _ = select.select(list(socks), [], [], 0)
        for sock in readable:  # the processor answered (408) or closed: it cut us off
            with contextlib.suppress(OSError):
                sock.recv(65536)
            stats["cut_off"] += 1
            sock.close()
            socks.pop(sock, None)
        for sock, rest in list(socks.items()):
            try:
                sock.send(rest[:1])
                socks[sock] = rest[1:] or rest
            except OSError:
                stats["cut_off"] += 1
                sock.close()
                socks.pop(sock, None)
        stop.wait(2.0)
    for sock in socks:
        sock.close()


def prober(processor: Processor, stop: threading.Event, down: threading.Event,
           latencies: list[float], failures: Counter) -> None:
    """GET /healthz every 50 ms on a fresh connection."""
    while not stop.is_set():
        started = time.perf_counter()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{processor.port}/healthz", timeout=5)
            if not down.is_set():
                latencies.append(time.perf_counter() - started)
        except OSError:
            if not down.is_set():
                failures["healthz"] += 1
        stop.wait(0.05)


def big_body_probe(processor: Processor, megabytes: int) -> dict:
    """Post one large NDJSON body (``megabytes`` decompressed) and probe /healthz every 10 ms
    while it is read, decoded and parsed: the loop must keep answering."""
    if megabytes <= 0:
        return {}
    rng = np.random.default_rng(7)
    n = 20_000
    lines, size, rank = [], 0, 0
    now = time.time_ns()
    while size < megabytes << 20:
        record = {"v": 1, "kind": "kernels", "job": "big-body", "rank": rank % 64,
                  "names": NAMES, "name": rng.integers(0, len(NAMES), n),
                  "stream": np.full(n, 7), "start_ns": now - 10**9 + np.arange(n) * 1000,
                  "dur_ns": rng.integers(500, 900, n)}
        line = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        lines.append(line)
        size += len(line)
        rank += 1
    body = gzip.compress(b"".join(lines), 1)
    done = threading.Event()
    latencies: list[float] = []

    def probe():
        while not done.is_set():
            started = time.perf_counter()
            urllib.request.urlopen(f"http://127.0.0.1:{processor.port}/healthz", timeout=30)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", processor.port, timeout=300)
    conn.request("POST", "/v1/records", body=body, headers={"Content-Encoding": "gzip"})
    response = conn.getresponse()
    response.read()
    took = time.perf_counter() - started
    done.set()
    thread.join(30)
    latency = np.array(latencies) * 1e3
    return {"big_body_mb": size / 2**20, "big_body_status": response.status,
            "big_body_seconds": took, "big_body_healthz_probes": len(latencies),
            "big_body_healthz_p99_ms": float(np.percentile(latency, 99)),
            "big_body_healthz_max_ms": float(latency.max())}


def spread_body(windows: int, ranks: int, job: str) -> bytes:
    """One kernel a minute for ``windows`` minutes up to now, for each of ``ranks`` ranks."""
    now = time.time_ns() // 60_000_000_000 * 60_000_000_000
    records = [{"v": 1, "kind": "kernels", "job": job, "rank": rank, "names": ["gemm"],
                "name": [0] * windows, "stream": [7] * windows,
                "start_ns": [now - (windows - 1 - i) * 60_000_000_000 + 1000
                             for i in range(windows)], "dur_ns": [50_000] * windows}
               for rank in range(ranks)]
    return gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in records), 1)


def wide_job(processor: Processor, ranks: int, stop: threading.Event,
             ledger: Ledger) -> None:
    """Identities and one kernel batch for ``ranks`` ranks of one job (1,000 per body): once
    their window closes, /metrics carries kernel summaries for all of them."""
    for first in range(0, ranks, 1000):
        records, now = [], time.time_ns()
        for rank in range(first, min(first + 1000, ranks)):
            records.append({"v": 1, "kind": "rank", "job": "wide", "rank": rank,
                            "world_size": ranks, "host": f"node-{rank // 8}"})
            records.append({"v": 1, "kind": "kernels", "job": "wide", "rank": rank,
                            "names": NAMES[:4], "name": [0, 1, 2, 3], "stream": [7] * 4,
                            "start_ns": [now - 10**9 + i * 10**6 for i in range(4)],
                            "dur_ns": [20_000, 30_000, 40_000, 50_000]})
        body = gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in records), 1)
        answer = post_until_answered(processor, body, stop, ledger)
        if answer is None:
            return
        for rank in range(first, min(first + 1000, ranks)):  # late ones are per body: none
            ledger.add(("wide", rank), Counter(kernels=4), {})


def hostile(processor: Processor, stop: threading.Event, stats: Counter,
            scrapes: list[tuple[float, int]]) -> None:
    """Every ~2 s: a body spreading kernels over a day (must be refused whole), four
    concurrent 24 MB chunked bodies, four /metrics requests that never read their answer,
    and one real scrape of /metrics (its seconds and bytes recorded)."""
    attack = spread_body(1430, 20, "hostile-spread")
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", processor.port, timeout=30)
            conn.request("POST", "/v1/records", body=attack,
                         headers={"Content-Encoding": "gzip"})
            stats[f"spread_{conn.getresponse().status}"] += 1
            conn.close()
        except (OSError, http.client.HTTPException):
            stats["spread_error"] += 1
        socks = []
        for _ in range(4):
            with contextlib.suppress(OSError):
                sock = socket.create_connection(("127.0.0.1", processor.port), timeout=5)
                sock.sendall(b"POST /v1/records HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                             b"chunked\r\nContent-Encoding: gzip\r\n\r\n")
                socks.append(sock)
        piece = b"%x\r\n" % (1 << 20) + b"\x00" * (1 << 20) + b"\r\n"
        for _ in range(24):
            for sock in list(socks):
                try:
                    sock.sendall(piece)
                except OSError:
                    socks.remove(sock)
                    sock.close()
                    stats["chunked_cut_off"] += 1
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(b"0\r\n\r\n")
                stats[f"chunked_{sock.recv(12)[9:12].decode() or 'closed'}"] += 1
            sock.close()
        readers = []
        for _ in range(4):
            with contextlib.suppress(OSError):
                sock = socket.create_connection(("127.0.0.1", processor.port), timeout=5)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                readers.append(sock)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{processor.port}/metrics",
                                        timeout=60) as response:
                size = len(response.read())
            scrapes.append((time.perf_counter() - started, size))
        except OSError:
            stats["scrape_failed"] += 1
        stop.wait(2.0)
        for sock in readers:
            sock.close()


def read_back(store: Path) -> tuple[dict, dict]:
    """(job, rank) -> Counter of kernels, steps, stacks in the files; -> process names."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    found: dict[tuple[str, int], Counter] = defaultdict(Counter)
    process: dict[tuple[str, int], set] = defaultdict(set)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from argus_core.processor.store import parse_key

    for path in store.rglob("*.pftrace.gz"):
        ref = parse_key(path.relative_to(store).as_posix())
        key = (ref.job, ref.rank)
        kernel_tracks = set()
        for packet in Trace.FromString(gzip.decompress(path.read_bytes())).packet:
            desc = packet.track_descriptor
            if desc.HasField("process"):
                process[key].add(desc.process.process_name)
            if desc.name.startswith("stream "):
                kernel_tracks.add(desc.uuid)
            event = packet.track_event
            if event.type == TrackEvent.TYPE_SLICE_BEGIN:
                if event.track_uuid in kernel_tracks:
                    found[key]["kernels"] += 1
                elif event.name.startswith("step "):
                    found[key]["steps"] += 1
            elif event.type == TrackEvent.TYPE_INSTANT:
                found[key]["stacks"] += 1
    return found, process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--ranks", type=int, default=4, help="ranks per job")
    parser.add_argument("--kernels", type=int, default=1500, help="kernels per body")
    parser.add_argument("--job-every", type=float, default=10.0)
    parser.add_argument("--job-life", type=float, default=40.0)
    parser.add_argument("--loris", type=int, default=300)
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--big-body-mb", type=int, default=60,
                        help="first post one body this big and probe /healthz meanwhile (0: no)")
    parser.add_argument("--hostile", action="store_true",
                        help="add the hostile mix: day-spread bodies, concurrent chunked "
                             "bodies, /metrics readers that never read, a --wide-ranks job")
    parser.add_argument("--wide-ranks", type=int, default=10_000,
                        help="with --hostile: ranks of the wide job on /metrics")
    parser.add_argument("--processor-args", default="")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (store, spool, processor.log)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="argus-soak-"))
    processor = Processor(work, args)
    processor.start()
    idle = []
    for _ in range(40):
        started = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{processor.port}/healthz", timeout=5)
        idle.append(time.perf_counter() - started)
    big = big_body_probe(processor, args.big_body_mb)

    stop, down = threading.Event(), threading.Event()
    ledger, loris_stats, failures = Ledger(), Counter(), Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    groups: list[list[Rank]] = [[], []]
    threads = [threading.Thread(target=poster, args=(processor, g, lock, stop, ledger, 0.3),
                                daemon=True) for g in groups]
    threads.append(threading.Thread(target=slow_loris,
                                    args=(processor, args.loris, stop, loris_stats),
                                    daemon=True))
    threads.append(threading.Thread(target=prober,
                                    args=(processor, stop, down, latencies, failures),
                                    daemon=True))
    hostile_stats: Counter = Counter()
    scrapes: list[tuple[float, int]] = []
    if args.hostile:
        threads.append(threading.Thread(target=hostile, daemon=True,
                                        args=(processor, stop, hostile_stats, scrapes)))
        threads.append(threading.Thread(target=wide_job, daemon=True,
                                        args=(processor, args.wide_ranks, stop, ledger)))
    for thread in threads:
        thread.start()
    rss: list[tuple[float, float, int]] = []  # (seconds, MB, which start)
    fds: list[int] = []
    start = time.monotonic()
    jobs: list[tuple[float, list[Rank]]] = []
    next_job = 0.0
    killed = False
    recovery_s = None
    generation = 0
    while (now := time.monotonic() - start) < args.seconds:
        if now >= next_job:
            job = [Rank(f"job-{len(jobs)}", r, args.kernels, seed=len(jobs) * 100 + r)
                   for r in range(args.ranks)]
            jobs.append((now, job))
            with lock:
                for r in job:
                    groups[r.rank % 2].append(r)
            next_job += args.job_every
        with lock:
            for born, job in jobs:
                if now - born >= args.job_life:
                    for r in job:
                        if r in groups[r.rank % 2]:
                            groups[r.rank % 2].remove(r)
        if not killed and now >= args.seconds / 2:
            down.set()
            processor.kill()
            killed = True
            generation = 1
            recovery_s = processor.start()
            down.clear()
        value = processor.rss_mb()
        if value is not None:
            rss.append((now, value, generation))
        with contextlib.suppress(OSError, AttributeError):
            fds.append(len(os.listdir(f"/proc/{processor.proc.pid}/fd")))
        time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(60)
    code = processor.stop()
    found, process = read_back(work / "store")

    acked_total, found_total = Counter(), Counter()
    lost: Counter = Counter()
    duplicates: Counter = Counter()
    for key, acked in ledger.acked.items():
        for kind in ("kernels", "steps", "stacks"):
            got = found[key][kind]
            acked_total[kind] += acked[kind]
            found_total[kind] += got
            lost[kind] += max(0, acked[kind] - got)
            duplicates[kind] += max(0, got - acked[kind])
    unnamed = sum(1 for key, names in process.items()  # ranks that sent their identity
                  if key in ledger.acked and (not names or any("(" not in n for n in names)))
    latency = np.array(latencies) * 1e3
    out = {"seconds": args.seconds, "exit_code": code, "jobs": len(jobs),
           "ranks": len(ledger.acked), "posts": ledger.posts, "retries_503": ledger.retries,
           "connection_errors": ledger.refused,
           **{f"acked_{k}": v for k, v in acked_total.items()},
           **{f"written_{k}": v for k, v in found_total.items()},
           **{f"late_{k}": sum(a[f"late_{k}"] for a in ledger.acked.values())
              for k in ("kernels", "steps", "stacks")},
           "lost": sum(lost.values()), **{f"lost_{k}": v for k, v in lost.items()},
           "duplicates": sum(duplicates.values()),
           "files_without_host_in_process_name": unnamed,
           "kernel_events_per_s": acked_total["kernels"] / args.seconds,
           "recovery_s": recovery_s,
           "healthz_idle_p99_ms": float(np.percentile(np.array(idle) * 1e3, 99)),
           "healthz_probes": len(latencies),
           "healthz_p50_ms": float(np.percentile(latency, 50)) if len(latency) else None,
           "healthz_p99_ms": float(np.percentile(latency, 99)) if len(latency) else None,
           "healthz_max_ms": float(latency.max()) if len(latency) else None,
           "healthz_failures": failures["healthz"],
           "loris_opened": loris_stats["opened"], "loris_cut_off": loris_stats["cut_off"],
           **big,
           **_rss_summary(rss),
           "descriptors_max": max(fds, default=None)}
    if args.hostile:
        out.update({f"hostile_{k}": v for k, v in sorted(hostile_stats.items())})
        out["hostile_scrapes"] = len(scrapes)
        out["hostile_scrape_max_s"] = max((t for t, _ in scrapes), default=None)
        out["hostile_scrape_max_mb"] = max((n for _, n in scrapes), default=0) / 2**20
    report(out, args.json)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if out["lost"] == 0 and code == 0 else 1


def _rss_summary(samples: list[tuple[float, float, int]]) -> dict:
    """Highest RSS of each start after its first 20 s, and each start's slope."""
    out = {}
    for generation, label in ((0, "first_half"), (1, "second_half")):
        mine = [(t, m) for t, m, g in samples if g == generation]
        if not mine:
            continue
        t0 = mine[0][0]
        warm = [(t, m) for t, m in mine if t - t0 >= 20]
        out[f"rss_mb_{label}_max"] = max(m for _, m in warm) if warm else None
        if len(warm) >= 3:
            t, m = (np.array(c) for c in zip(*warm, strict=True))
            slope = float(np.polyfit(t, m, 1)[0] * 60)
            out["rss_slope_mb_per_min" if generation else "rss_first_half_slope_mb_per_min"] = slope
    return out


if __name__ == "__main__":
    sys.exit(main())
