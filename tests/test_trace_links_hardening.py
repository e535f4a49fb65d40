"""The /v1/traces routes under hostile or careless clients (issue 20): every bad input is a 400
with its reason, the Host header never reaches a redirect, non-reading downloads keep memory
and download slots bounded, and an optional read token guards every route (signed, expiring
file links for the Perfetto UI, which fetches by URL alone).

Servers run on loopback: in-process (aiohttp's TestServer) for the answers, in a subprocess
for what is measured from outside (its RSS, its download slots through a ``/state`` route).
Every wait polls a condition with a generous deadline (a loaded 2-core machine is slow)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support import wait_for
from test_trace_links import fetch, perfetto_target

from argus_core.processor import links
from argus_core.processor.store import FileStore, open_store, trace_key

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_795_003_200_000_000_000  # 2026-11-18T12:00:00Z, a whole minute
KEY = trace_key("", "job-a", 0, T0)
OTHER_KEY = trace_key("", "job-a", 1, T0)
DATA = b"\x1f\x8b" + b"a small trace" * 100
TOKEN = "s3cret-read-token"
BIG_BYTES = 28 * 1024 * 1024
LINK_QUERY = f"job=job-a&rank=0&at={(T0 + 1_000_000_000) // 1_000_000}"


# -- in-process servers ----------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path) -> FileStore:
    """A directory store holding two small traces (ranks 0 and 1 of job-a at T0)."""
    store = FileStore(tmp_path / "store")
    store.put(KEY, DATA)
    store.put(OTHER_KEY, DATA + b"1")
    return store


def serve(app: web.Application, scenario: Callable[[int], Any]) -> Any:
    """Run ``scenario(port)`` (blocking code, in a thread) against ``app`` on loopback."""
    async def main():
        server = TestServer(app)
        await server.start_server()
        try:
            return await asyncio.to_thread(scenario, server.port)
        finally:
            await server.close()

    return asyncio.run(main())


def app_for(store: FileStore, **options: Any) -> web.Application:
    app = web.Application()
    links.add_routes(app, store, **options)
    return app


def raw_get(port: int, target: str, headers: dict[str, str] | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    """GET ``target`` exactly as written (no client-side path normalisation), one connection."""
    lines = [f"GET {target} HTTP/1.1", "Connection: close",
             *(f"{name}: {value}" for name, value in
               {"Host": "127.0.0.1", **(headers or {})}.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    found = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), found, body


# -- (a) bad input is a 400 with the reason --------------------------------------------------------
@pytest.mark.parametrize("target, reason", [
    ("/v1/traces/open?job=job-a&rank=%C2%B2&at=1", "rank='\\u00b2'"),  # str.isdigit takes '²'
    ("/v1/traces/open?job=job-a&rank=" + "9" * 5000 + "&at=1", "rank='9999"),
    ("/v1/traces/open?job=job-a&rank=2147483648&at=1", "an integer from 0 to 2147483647"),
    ("/v1/traces/perfetto?job=job-a&rank=%D9%A1&at=1", "ASCII digits"),  # Arabic-Indic one
    ("/v1/traces/open?job=job-a&rank=0&at=" + "1" * 30, "outside the years 1970 to 9999"),
    ("/v1/traces/open?job=job-a&rank=0&at=" + "1" * 5000, "too long"),
    ("/v1/traces/open?job=job-a&rank=0&at=9999-12-31T23:59:59-14:00", "outside the years"),
    ("/v1/traces/open?job=job-a&rank=0&at=0001-01-01T00:00:00%2B14:00", "outside the years"),
    ("/v1/traces/open?job=job-a&rank=0&at=1969-12-31T23:59:59Z", "outside the years"),
    ("/v1/traces/open?job=" + "j" * 2000 + "&rank=0&at=1", "at most 1024"),
    (links.FILE_ROUTE + "../../etc/job-a/rank=0/20261118T120000Z.pftrace.gz", "not a trace key"),
    (links.FILE_ROUTE + "%2e%2e/%2e%2e/job-a/rank=0/20261118T120000Z.pftrace.gz",
     "'../../job-a/"),
    (links.FILE_ROUTE + "x/%2e%2e/job-a/rank=0/20261118T120000Z.pftrace.gz", "not a trace key"),
    (links.FILE_ROUTE + "/job-a/rank=0/20261118T120000Z.pftrace.gz", "not a trace key"),
    (links.FILE_ROUTE + "a//job-a/rank=0/20261118T120000Z.pftrace.gz", "not a trace key"),
    (links.FILE_ROUTE + "%00/job-a/rank=0/20261118T120000Z.pftrace.gz", "not a trace key"),
    (links.FILE_ROUTE + "a%5Cb/job-a/rank=0/20261118T120000Z.pftrace.gz", "not a trace key"),
    (links.FILE_ROUTE + "secret.txt", "expected JOB/rank=R/YYYYMMDDTHHMMSSZ.pftrace.gz"),
])
def test_bad_link_input_is_a_400_with_the_reason(store, target, reason):
    status, headers, body = serve(app_for(store), lambda port: raw_get(port, target))
    assert status == 400, (status, body[:300])
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert reason in json.dumps(error), error
    assert len(error) < 300  # a 5,000-digit argument is not echoed back whole


@pytest.mark.parametrize("target, status", [
    ("/v1/traces/open?job=job-a&rank=0&at=9999-12-31T23:59:59.999999Z", 404),  # last instant
    ("/v1/traces/open?job=job-a&rank=0&at=1970-01-01T00:00:00Z", 404),
    (links.FILE_ROUTE + trace_key("", "job-b", 0, T0), 404),  # a trace key that is not there
    (links.FILE_ROUTE + KEY, 200),
])
def test_well_formed_input_at_the_edges_is_answered(store, target, status):
    got, _, body = serve(app_for(store), lambda port: raw_get(port, target))
    assert got == status, body[:300]


# -- (b) no Host header reflection -----------------------------------------------------------------
def test_perfetto_link_never_reflects_the_host_header(store, monkeypatch):
    monkeypatch.delenv(links.PUBLIC_URL_ENV, raising=False)
    forged = {"Host": "evil.example:666", "X-Forwarded-Host": "evil.example"}

    def scenario(port):
        return port, raw_get(port, f"/v1/traces/perfetto?{LINK_QUERY}", forged)

    port, (status, headers, _) = serve(app_for(store), scenario)
    assert status == 302
    assert "evil" not in headers["Location"]
    assert perfetto_target(headers["Location"]) == \
        f"http://127.0.0.1:{port}{links.FILE_ROUTE}{KEY}"  # the address the client reached

    monkeypatch.setenv(links.PUBLIC_URL_ENV, "https://argus.example.org/proc/")
    _, (status, headers, _) = serve(app_for(store), scenario)
    assert perfetto_target(headers["Location"]) == \
        f"https://argus.example.org/proc{links.FILE_ROUTE}{KEY}"


def test_a_malformed_public_url_is_refused_at_start(store, monkeypatch):
    monkeypatch.setenv(links.PUBLIC_URL_ENV, "argus.example.org")
    with pytest.raises(ValueError, match=links.PUBLIC_URL_ENV):
        app_for(store)


# -- (c) bounded memory and download slots (a processor in a subprocess) ---------------------------
SERVER = """
import asyncio, sys
from aiohttp import web
from argus_core.processor import links
from argus_core.processor.store import FileStore

async def main(root, max_downloads, write_timeout_s):
    app = web.Application()
    links.add_routes(app, FileStore(root), max_downloads=int(max_downloads),
                     write_timeout_s=float(write_timeout_s))
    async def state(request):
        return web.json_response({"active": app[links.SETTINGS_KEY].downloads.active})
    app.router.add_get("/state", state)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """A directory store with one 28 MB trace (incompressible), as in the red team's report."""
    root = tmp_path_factory.mktemp("big")
    FileStore(root).put(KEY, os.urandom(BIG_BYTES))
    return root


@contextlib.contextmanager
def processor(root: Path, max_downloads: int, write_timeout_s: float
              ) -> Iterator[tuple[subprocess.Popen, int]]:
    """The link routes of a directory store in a subprocess: (process, port)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(root), str(max_downloads),
                             str(write_timeout_s)], stdout=subprocess.PIPE, cwd=ROOT, text=True)
    try:
        port = int(proc.stdout.readline())
        yield proc, port
    finally:
        proc.kill()
        proc.wait(30)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def active_downloads(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=30) as answer:
        return json.load(answer)["active"]


def stalled_get(port: int, target: str = links.FILE_ROUTE + KEY) -> socket.socket:
    """A client that sends a GET and never reads (a tiny receive buffer, so it stalls soon)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def peeked_head(sock: socket.socket) -> str | None:
    """The status line and headers waiting in the socket, without reading them; None if the
    answer has not (wholly) arrived yet."""
    try:
        waiting = sock.recv(16384, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    head, found, _ = waiting.partition(b"\r\n\r\n")
    return head.decode("latin-1") if found else None


def test_non_reading_downloads_keep_memory_bounded_and_the_ninth_gets_503(big_store):
    with processor(big_store, max_downloads=8, write_timeout_s=120) as (proc, port):
        status, _, body = fetch(f"http://127.0.0.1:{port}{links.FILE_ROUTE}{KEY}")  # warm up
        assert status == 200 and len(body) == BIG_BYTES
        del body
        # The client holds the whole body before the server's handler gives its slot back.
        wait_for(lambda: active_downloads(port) == 0, "the warm-up download's slot back")
        baseline = rss_bytes(proc.pid)
        sockets = [stalled_get(port) for _ in range(40)]
        peak = baseline

        def every_answer_arrived():
            nonlocal peak
            peak = max(peak, rss_bytes(proc.pid))
            heads = [peeked_head(sock) for sock in sockets]
            return heads if all(heads) else None

        try:
            heads = wait_for(every_answer_arrived, "an answer on all 40 connections")
            statuses = [int(head.split()[1]) for head in heads]
            assert sorted(statuses) == [200] * 8 + [503] * 32, statuses
            wait_for(lambda: active_downloads(port) == 8, "8 downloads in progress")
            peak = max(peak, rss_bytes(proc.pid))
            refused = [head for head in heads if head.startswith("HTTP/1.1 503")]
        finally:
            for sock in sockets:
                sock.close()
    assert all("Retry-After: 5" in head for head in refused)
    growth = peak - baseline
    print(f"RSS baseline {baseline / 2**20:.0f} MiB, peak growth {growth / 2**20:.1f} MiB "
          "with 40 non-reading GETs of a 28 MB trace")
    assert growth < 64 * 2**20, f"RSS grew {growth / 2**20:.0f} MiB"


def test_503_names_the_cap(store):
    app = app_for(store, max_downloads=1)
    app[links.SETTINGS_KEY].downloads.active = 1  # one download in progress
    status, headers, body = serve(app, lambda port: raw_get(port, links.FILE_ROUTE + KEY))
    assert status == 503 and headers["Retry-After"] == str(links.RETRY_AFTER_S)
    assert "1 trace downloads are in progress" in json.loads(body)["error"]


def test_write_deadline_frees_the_slots_of_clients_that_never_read(big_store):
    with processor(big_store, max_downloads=2, write_timeout_s=4) as (_, port):
        url = f"http://127.0.0.1:{port}{links.FILE_ROUTE}{KEY}"
        stalled = [stalled_get(port) for _ in range(2)]
        try:
            wait_for(lambda: active_downloads(port) == 2, "2 stalled downloads holding slots")
            status, headers, _ = fetch(url)
            assert status == 503, "both slots are held while the stalled clients take nothing"
            assert headers["Retry-After"] == str(links.RETRY_AFTER_S)

            def a_download():
                status, _, body = fetch(url)
                return status == 200 and len(body) == BIG_BYTES

            wait_for(a_download, "a slot freed by the write deadline")
            wait_for(lambda: active_downloads(port) == 0, "every slot back")
            for sock in stalled:  # what they hold is a cut answer, then the end
                sock.settimeout(30)
                received = 0
                with contextlib.suppress(ConnectionResetError):
                    while chunk := sock.recv(1 << 20):
                        received += len(chunk)
                assert received < BIG_BYTES
        finally:
            for sock in stalled:
                sock.close()


# -- (d) the read token ----------------------------------------------------------------------------
ROUTES = [f"/v1/traces/open?{LINK_QUERY}", f"/v1/traces/perfetto?{LINK_QUERY}",
          links.FILE_ROUTE + KEY]


def test_read_token_is_needed_on_every_route(store):
    def scenario(port):
        return [raw_get(port, route, headers) for route in ROUTES
                for headers in ({}, {"Authorization": "Bearer wrong"},
                                {"Authorization": f"Basic {TOKEN}"})] + \
               [raw_get(port, ROUTES[0] + "&token=wrong"), raw_get(port, ROUTES[0] + "&token=")]

    for status, headers, body in serve(app_for(store, read_token=TOKEN), scenario):
        assert status == 401, body
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert "read token" in json.loads(body)["error"]


def test_read_token_as_header_or_query_parameter(store):
    def scenario(port):
        return [raw_get(port, ROUTES[0], {"Authorization": f"Bearer {TOKEN}"}),
                raw_get(port, ROUTES[0], {"Authorization": f"bearer {TOKEN}"}),
                raw_get(port, f"{ROUTES[0]}&token={quote(TOKEN)}"),
                raw_get(port, f"{ROUTES[2]}?token={quote(TOKEN)}")]

    for status, _, body in serve(app_for(store, read_token=TOKEN), scenario):
        assert status == 200 and body == DATA


def test_perfetto_redirect_carries_a_signed_expiring_file_link(store, monkeypatch):
    monkeypatch.setenv(links.EXPIRES_ENV, "120")

    def scenario(port):
        status, headers, _ = raw_get(port, f"/v1/traces/perfetto?{LINK_QUERY}&token={TOKEN}")
        assert status == 302
        location = headers["Location"]
        target = perfetto_target(location)
        expired = links.signed_file_path(TOKEN, KEY, int(time.time()) - 1)
        return location, target, fetch(target), raw_get(port, expired), time.time()

    location, target, fetched, expired, now = serve(app_for(store, read_token=TOKEN),
                                                    scenario)
    assert TOKEN not in location  # the token never reaches the Perfetto UI
    parts = urlsplit(target)
    assert parts.path == links.FILE_ROUTE + KEY
    query = parse_qs(parts.query)
    assert set(query) == {"exp", "sig"}
    assert now + 100 < int(query["exp"][0]) <= now + 121
    status, headers, body = fetched  # no token, no header: the URL alone, as the UI fetches
    assert status == 200 and body == DATA
    assert headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
    status, _, body = expired
    assert status == 403 and "expired" in json.loads(body)["error"]


def test_tampered_signed_links_are_refused(store):
    expires_at = int(time.time()) + 600
    good = links.signed_file_path(TOKEN, KEY, expires_at)
    path, _, query = good.partition("?")
    signature = parse_qs(query)["sig"][0]
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    forged = {
        "flipped signature": f"{path}?exp={expires_at}&sig={flipped}",
        "later expiry": f"{path}?exp={expires_at + 3600}&sig={signature}",
        "another key": f"{links.FILE_ROUTE}{OTHER_KEY}?exp={expires_at}&sig={signature}",
        "another token": links.signed_file_path("guessed", KEY, expires_at),
        "no expiry": f"{path}?sig={signature}",
        "upper-case hex": f"{path}?exp={expires_at}&sig={signature.upper()}",
    }

    def scenario(port):
        return raw_get(port, good), {name: raw_get(port, target)
                                     for name, target in forged.items()}

    (status, _, body), refused = serve(app_for(store, read_token=TOKEN), scenario)
    assert status == 200 and body == DATA
    for name, (status, _, body) in refused.items():
        assert status == 403, (name, status, body)
        assert "sig" in json.loads(body)["error"] or "signature" in json.loads(body)["error"]


def test_without_a_read_token_token_parameters_are_ignored(store):
    def scenario(port):
        return [raw_get(port, f"{ROUTES[0]}&token="), raw_get(port, f"{ROUTES[0]}&token=x"),
                raw_get(port, f"{ROUTES[2]}?token=&exp=1&sig=00")]

    for status, _, body in serve(app_for(store), scenario):
        assert status == 200 and body == DATA


def test_kernels_dashboard_links_work_with_and_without_a_read_token(store):
    board = json.loads((ROOT / "grafana/dashboards/argus-kernels.json").read_text())
    templates = {link["url"] for panel in board["panels"] for link in
                 panel.get("fieldConfig", {}).get("defaults", {}).get("links", ())
                 if "/v1/traces/" in link["url"]}
    assert templates and all("${argus_read_token:percentencode}" in url for url in templates)
    names = [variable["name"] for variable in board["templating"]["list"]]
    token_variable = board["templating"]["list"][names.index("argus_read_token")]
    assert token_variable["hide"] == 2 and token_variable.get("query", "") == ""

    def filled(template: str, port: int, token: str) -> str:
        """The link as Grafana fills it in for rank 0's point at T0 + 1 s."""
        at = str((T0 + 1_000_000_000) // 1_000_000)
        url = template.replace("${traces}", f"http://127.0.0.1:{port}")
        for name, value in {"${job:percentencode}": "job-a", "${__field.labels.rank}": "0",
                            "${__data.fields.rank}": "0", "${__value.time}": at,
                            "${__data.fields.Time}": at,
                            "${argus_read_token:percentencode}": quote(token, safe="")}.items():
            url = url.replace(name, value)
        return url

    def scenario(token):
        def clicks(port):
            return [fetch(filled(template, port, token))[0] for template in templates]
        return clicks

    assert set(serve(app_for(store), scenario(""))) <= {200, 302}  # empty variable: no token
    assert set(serve(app_for(store, read_token=TOKEN), scenario(TOKEN))) <= {200, 302}
    assert set(serve(app_for(store, read_token=TOKEN), scenario(""))) == {401}


def test_s3_file_route_streams_the_object(s3):
    s3_store = open_store(s3.url("traces"))
    key = trace_key(s3_store.prefix, "job-a", 0, T0)
    data = os.urandom(3 * links.CHUNK_BYTES + 17)  # several chunks and a short one
    s3_store.put(key, data)
    body, size = s3_store.open_stream(key)
    with contextlib.closing(body):
        assert size == len(data) and body.read(10) == data[:10]
    status, headers, got = serve(app_for(s3_store),
                                 lambda port: raw_get(port, links.FILE_ROUTE + key))
    assert status == 200 and got == data and headers["Content-Length"] == str(len(data))
