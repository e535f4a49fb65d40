"""Benchmark: the exporters' HTTP sink against receivers that never finish answering.

    python bench/sink_bounds.py [--steps 200] [--json]

A stand-in training loop (a 5 ms phase, then 20 ms outside it, per step) ships its records to
a receiver on loopback: a healthy one (the baseline, same run), then one that answers 200 and
trickles its body a byte every 50 ms, one whose answer is 1 GiB long, and one whose chunked
answer never ends. Per receiver: the slowest step over the baseline's (target <= 2x), the
time ``shutdown(timeout=1)`` took (its bound: flush + join timeouts + one post deadline,
``http_timeout_s`` = 0.5 s here), RSS growth, records shipped and dropped.
"""

from __future__ import annotations

import argparse
import http.server
import os
import socket
import threading
import time

from _report import report

from argus_exporters.clock import HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import Tracer

IDENTITY = RankIdentity("sink-bounds", 0, 1, 0, "localhost", {"dp": 0, "tp": 0, "pp": 0,
                                                              "ep": 0})
TIMEOUT_S = 0.5


class HostileReceiver:
    """Accepts connections, reads each request and answers in a chosen bad way, forever."""

    def __init__(self, mode: str):
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sent = 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.recv(1 << 20)  # the request (small, one read is enough on loopback)
            if self.mode == "trickle":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                while not self.stop.is_set():
                    conn.sendall(b"x")
                    self.sent += 1
                    time.sleep(0.05)
            elif self.mode == "huge":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                chunk = b"x" * 65536
                while not self.stop.is_set() and self.sent < 1 << 30:
                    conn.sendall(chunk)
                    self.sent += len(chunk)
            elif self.mode == "endless":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while not self.stop.is_set():
                    conn.sendall(b"10000\r\n" + b"x" * 65536 + b"\r\n")
                    self.sent += 65536
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


class _Healthy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def rss_mb() -> float:
    """Resident set size of this process in MiB (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(port: int, steps: int) -> dict:
    """The stand-in loop against ``port``; its slowest step, shutdown time and health."""
    rss0 = rss_mb()
    tracer = Tracer(Settings(enabled=True, sink=f"http://127.0.0.1:{port}/v1", flush_s=0.05,
                             http_timeout_s=TIMEOUT_S, http_retry_s=0.0), IDENTITY,
                    clock=HostClock())
    slowest = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        with tracer.phase("forward"):
            time.sleep(0.005)
        tracer.step()
        slowest = max(slowest, time.perf_counter() - t0)
        time.sleep(0.02)
    t0 = time.perf_counter()
    tracer.shutdown(timeout=1.0)
    health = tracer.health
    return {"max_step_ms": slowest * 1e3, "shutdown_s": time.perf_counter() - t0,
            "rss_growth_mb": rss_mb() - rss0, "shipped": health.records_shipped,
            "dropped": dict(health.dropped)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = {"baseline": run(server.server_address[1], args.steps)}
    finally:
        server.shutdown()
    for mode in ("trickle", "huge", "endless"):
        receiver = HostileReceiver(mode)
        try:
            result[mode] = run(receiver.port, args.steps)
        finally:
            receiver.close()
        result[mode]["max_step_vs_baseline"] = (result[mode]["max_step_ms"]
                                                / result["baseline"]["max_step_ms"])
        result[mode]["answer_bytes_sent"] = receiver.sent
    result["bound_s"] = 1.0 + 1.0 + TIMEOUT_S
    report(result, args.json)


if __name__ == "__main__":
    main()
