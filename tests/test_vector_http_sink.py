"""The exporters' HTTP sink toward a busy receiver behaves like Vector's: on 429 or 503 it
waits as ``Retry-After`` says and retries within its budget instead of dropping the batch, and
every record ends up either delivered or counted as dropped. All of it on the shipper's
thread: the training thread never waits and the queue stays bounded."""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import http.server
import socket
import threading
import time
from collections.abc import Callable

import pytest

from argus_exporters.config import ConfigError, Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.shipper import Shipper
from argus_exporters.sinks.http import HttpSink, retry_after_seconds

IDENTITY = RankIdentity("job-a", 3, 8, 3, "node-0", {"dp": 3, "tp": 0, "pp": 0, "ep": 0})


class Receiver:
    """A real HTTP server whose answers a test scripts: ``answer(n) -> (status, headers)``."""

    def __init__(self, answer: Callable[[int], tuple[int, dict]]):
        self.answer = answer
        self.attempts: list[float] = []  # monotonic time of each request
        self.bodies: list[bytes] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                n = len(receiver.attempts)
                receiver.attempts.append(time.monotonic())
                status, headers = receiver.answer(n)
                if 200 <= status < 300:
                    receiver.bodies.append(gzip.decompress(body))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/records"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(answer):
        made.append(Receiver(answer))
        return made[-1]

    yield make
    for r in made:
        r.close()


def sink_for(url: str, health: Health, **settings) -> HttpSink:
    return HttpSink(Settings(enabled=True, sink=url, **settings), IDENTITY, health)


LINES = [b'{"v":1,"kind":"step","n":%d}\n' % i for i in range(5)]


def test_503_with_retry_after_is_honoured_then_delivered(receiver):
    """Two 503s with Retry-After: 1, then 200: the batch arrives once, each retry waited at
    least the second the receiver asked for, and both retries are counted."""
    r = receiver(lambda n: (503, {"Retry-After": "1"}) if n < 2 else (200, {}))
    health = Health()
    assert sink_for(r.url, health).export(LINES)
    assert len(r.attempts) == 3 and r.bodies == [b"".join(LINES)]
    gaps = [b - a for a, b in zip(r.attempts, r.attempts[1:], strict=False)]
    assert min(gaps) >= 0.95, gaps  # never earlier than asked (a lower bound: load-safe)
    assert health.http_retries == {"503": 2}
    assert not health.dropped


def test_429_without_retry_after_backs_off_and_retries(receiver):
    """429 with no Retry-After: retried after the sink's own backoff, then delivered."""
    r = receiver(lambda n: (429, {}) if n == 0 else (200, {}))
    health = Health()
    assert sink_for(r.url, health).export(LINES)
    assert len(r.attempts) == 2 and health.http_retries == {"429": 1}


def test_a_wait_beyond_the_budget_gives_up_at_once(receiver):
    """Retry-After longer than the retry budget: no early retry, no pointless wait; the batch
    is reported as failed for a busy receiver."""
    r = receiver(lambda n: (503, {"Retry-After": "120"}))
    health = Health()
    sink = sink_for(r.url, health, http_retry_s=5.0)
    assert not sink.export(LINES)
    assert len(r.attempts) == 1
    assert sink.failure_reason == "receiver_busy"


def test_retries_stop_when_the_budget_is_spent(receiver):
    """Always 503 + Retry-After: 1 with a 2.5 s budget: three attempts (two 1 s waits), then
    the batch fails; the budget counts the waits asked for, so the count is exact."""
    r = receiver(lambda n: (503, {"Retry-After": "1"}))
    health = Health()
    sink = sink_for(r.url, health, http_retry_s=2.5)
    assert not sink.export(LINES)
    assert len(r.attempts) == 3 and health.http_retries == {"503": 2}
    assert sink.failure_reason == "receiver_busy"


@pytest.mark.parametrize("status", [400, 401, 404, 413])
def test_other_client_errors_are_not_retried(receiver, status):
    """A 4xx other than 429 will not change by retrying: one attempt, a sink error."""
    r = receiver(lambda n: (status, {}))
    health = Health()
    sink = sink_for(r.url, health)
    assert not sink.export(LINES)
    assert len(r.attempts) == 1 and not health.http_retries
    assert sink.failure_reason == "sink_error"


def test_retry_after_forms():
    """Retry-After is delta-seconds or an HTTP-date; anything else means 'not given'."""
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(" 0 ") == 0.0
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds(soon) <= 31
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after_seconds(past) == 0.0
    for bad in (None, "", "soon", "-4", "1.5e999"):
        assert retry_after_seconds(bad) is None


def test_retry_budget_setting_is_checked():
    """ARGUS_HTTP_RETRY_S is read and a bad value names the variable."""
    assert Settings.from_env({"ARGUS_HTTP_RETRY_S": "12"}).http_retry_s == 12.0
    assert Settings.from_env({"ARGUS_HTTP_RETRY_S": "0"}).http_retry_s == 0.0  # never retry
    with pytest.raises(ConfigError, match="ARGUS_HTTP_RETRY_S"):
        Settings.from_env({"ARGUS_HTTP_RETRY_S": "later"})


def test_busy_receiver_never_blocks_submit_and_every_record_is_accounted(receiver):
    """While the shipper's thread waits on a busy receiver, submit() still returns at once,
    the queue stays within its bound (oldest dropped, counted), and shutdown interrupts the
    wait: every submitted record is shipped or counted as dropped, none vanishes."""
    r = receiver(lambda n: (503, {"Retry-After": "2"}))
    health = Health()
    sink = sink_for(r.url, health, http_retry_s=60.0)
    shipper = Shipper(sink, health, max_records=10, batch_records=4, flush_s=0.02)
    shipper.submit(b'{"n":-1}\n')
    deadline = time.monotonic() + 30
    while not r.attempts and time.monotonic() < deadline:  # the thread is now in a retry wait
        time.sleep(0.01)
    assert r.attempts
    for i in range(100):
        shipper.submit(b'{"n":%d}\n' % i)
        assert shipper.depth <= 10
    assert health.dropped["queue_full"] > 0  # the oldest went, counted
    shipper.shutdown(timeout=1.0)  # interrupts the 2 s wait instead of sitting it out
    deadline = time.monotonic() + 30
    while health.records_shipped + sum(health.dropped.values()) < 101:
        assert time.monotonic() < deadline, (health.records_shipped, dict(health.dropped))
        time.sleep(0.02)
    assert health.records_shipped + sum(health.dropped.values()) == 101
    assert health.dropped["receiver_busy"] >= 1


def test_retries_show_in_metrics(receiver):
    """argus_exporter_http_retries_total{status} is on the rank's /metrics."""
    from prometheus_client import CollectorRegistry

    from argus_exporters.metrics import StepMetrics

    r = receiver(lambda n: (503, {"Retry-After": "0"}) if n == 0 else (200, {}))
    health = Health()
    assert sink_for(r.url, health).export(LINES)
    registry = CollectorRegistry()
    registry.register(StepMetrics(IDENTITY, health, window_steps=8))
    labels = {**IDENTITY.labels(), "status": "503"}
    assert registry.get_sample_value("argus_exporter_http_retries_total", labels) == 1.0


def test_shutdown_ends_a_retry_wait(receiver):
    """A batch waiting out a 60 s Retry-After is given up as soon as the sink shuts down
    (process exit must not hang on a busy receiver); after shutdown nothing waits at all."""
    r = receiver(lambda n: (503, {"Retry-After": "60"}))
    health = Health()
    sink = sink_for(r.url, health, http_retry_s=120.0)
    result = []
    worker = threading.Thread(target=lambda: result.append(sink.export(LINES)))
    worker.start()
    deadline = time.monotonic() + 30
    while not health.http_retries and time.monotonic() < deadline:
        time.sleep(0.01)
    sink.shutdown()
    worker.join(20)  # far below the 60 s it would otherwise wait
    assert not worker.is_alive() and result == [False]
    assert sink.failure_reason == "receiver_busy"
    assert not sink.export(LINES) and health.http_retries == {"503": 1}


def _serve_ok_on(port: int, keep_alive: bool = True) -> http.server.ThreadingHTTPServer:
    """A receiver answering 200 on ``port`` (HTTP/1.1 keep-alive, like the processor)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def setup(self):
            super().setup()
            self.server.connections.append(self.connection)

        def do_POST(self):
            self.server.bodies.append(gzip.decompress(
                self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.bodies = []
    server.connections = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stop(server: http.server.ThreadingHTTPServer) -> None:
    """Stop it as a killed process would: kept-alive connections are closed too."""
    server.shutdown()
    server.server_close()
    for connection in server.connections:
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)
        connection.close()


def test_a_receiver_restarting_is_waited_for_within_the_budget():
    """The processor restarting (SIGKILL, then systemd starts it again a second later): the
    batch posted while nothing listens is retried with backoff and delivered once the receiver
    is back, instead of being dropped while the processor's log would have kept it."""
    from support import free_port

    port = free_port()
    health = Health()
    sink = sink_for(f"http://127.0.0.1:{port}/v1/records", health, http_retry_s=30.0,
                    http_timeout_s=2.0)
    later: list[http.server.ThreadingHTTPServer] = []
    starter = threading.Timer(1.0, lambda: later.append(_serve_ok_on(port)))
    starter.start()
    try:
        assert sink.export(LINES)
        assert later[0].bodies == [b"".join(LINES)]
        assert health.http_retries.get("connection", 0) >= 1
    finally:
        starter.join()
        for server in later:
            _stop(server)
        sink.shutdown()


def test_a_kept_alive_connection_to_a_restarted_receiver_costs_no_batch():
    """After the receiver restarts, the sink's kept-alive connection is dead: the next batch
    goes out on a fresh connection instead of being dropped as a sink error."""
    from support import free_port

    port = free_port()
    health = Health()
    sink = sink_for(f"http://127.0.0.1:{port}/v1/records", health, http_retry_s=30.0)
    first = _serve_ok_on(port)
    try:
        assert sink.export(LINES[:1])
    finally:
        _stop(first)
    second = _serve_ok_on(port)
    try:
        assert sink.export(LINES[1:])
        assert second.bodies == [b"".join(LINES[1:])]
        assert sink.failure_reason is None
    finally:
        _stop(second)
        sink.shutdown()


def test_nothing_listening_for_the_whole_budget_is_a_sink_error():
    """A receiver that never comes back: the batch is given up once the budget is spent, as a
    sink error (the endpoint is wrong or down), not as a busy receiver."""
    from support import free_port

    health = Health()
    sink = sink_for(f"http://127.0.0.1:{free_port()}/v1/records", health, http_retry_s=1.0)
    assert not sink.export(LINES)
    assert sink.failure_reason == "sink_error"
    assert health.http_retries.get("connection", 0) >= 1


def test_shutdown_toward_a_dead_receiver_keeps_its_timeout_and_accounts_for_every_record():
    """Training exits while the processor is down: the shipper's shutdown(timeout) gives the
    receiver the timeout to come back, then stops the sink's retry wait and returns with every
    record shipped or counted, instead of waiting a second timeout for the stuck thread."""
    from support import free_port

    health = Health()
    sink = sink_for(f"http://127.0.0.1:{free_port()}/v1/records", health, http_retry_s=60.0)
    shipper = Shipper(sink, health, max_records=100, batch_records=4, flush_s=0.02)
    for i in range(10):
        shipper.submit(b'{"n":%d}\n' % i)
    deadline = time.monotonic() + 30
    while not health.http_retries and time.monotonic() < deadline:  # in a retry wait now
        time.sleep(0.01)
    began = time.monotonic()
    shipper.shutdown(timeout=4.0)
    took = time.monotonic() - began
    assert health.records_shipped + sum(health.dropped.values()) == 10, dict(health.dropped)
    assert took < 6.5, took  # one timeout (4 s) and the drain, not two


def test_a_refused_batch_logs_what_the_receiver_said(caplog):
    """A rank whose clock runs hours ahead: the processor refuses its records with a 400 that
    names the field and says to check the clock. That answer reaches the training log, not
    only a sink_error count that does not say why."""
    answer = (b'{"accepted": 0, "rejected": 5, "errors": ["line 1: t_ns: 7140 s ahead of the '
              b"processor's clock (more than 300 s; check the host's clock)\"]}")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.connections = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    health = Health()
    sink = sink_for(f"http://127.0.0.1:{server.server_address[1]}/v1/records", health)
    try:
        with caplog.at_level("WARNING", logger="argus_exporters"):
            assert not sink.export(LINES)
            assert not sink.export(LINES)
    finally:
        _stop(server)
    said = [r.getMessage() for r in caplog.records if "check the host's clock" in r.getMessage()]
    assert len(said) == 1 and "400" in said[0], [r.getMessage() for r in caplog.records]
