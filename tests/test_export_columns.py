"""The scorer's read of kernel summaries through victoria-metrics' ``/api/v1/export/csv``
(``PrometheusAPI.export_columns``, ``score/csv_columns.py``): against a real victoria-metrics,
the same series and values as the instant query it replaces, whatever the kernel names hold;
the same summary table through ``fetch_summaries``; every block boundary decoded alike; each
series' last sample kept; bad exports named by row; the answer bound held; a whole job's
phase table exported as it is queried."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from prom_support import Prometheus
from support import wait_for
from vm_support import import_series, victoria_metrics

from argus_core.score.csv_columns import MAX_ROW_BYTES, CsvColumns, CsvError
from argus_core.score.prometheus import (
    BAD_ANSWER,
    DEADLINE,
    HTTP_STATUS,
    STOPPED,
    TOO_LARGE,
    UNREACHABLE,
    PrometheusAPI,
    QueryError,
)
from argus_core.score.snapshot import SUMMARY_INTS, SUMMARY_TEXTS, fetch_job, fetch_summaries
from argus_core.score.vector_columns import VectorColumns

# Kernel names as profilers report them, and the worst a label can hold.
AWKWARD = ['void at::native::elementwise_kernel<128, 4, at::native::{lambda(int)#1}>(int)',
           'ncclDevKernel_AllReduce_Sum_bf16_RING_LL', 'say "hi", then "bye"', 'back\\slash\\',
           'tab\tnew\nline', 'ünïcödé 核函数 🚀', 'a & b < c > d', '"', ',', '""', 'x,"y"\n,z',
           'carriage\rreturn']
JOB = "export-test"
LOOKBACK_S = 3600.0  # both imported samples of every series, however late a test runs
MiB = 1 << 20


# --- the decoder alone


def rows(*lines: str) -> bytes:
    return ("".join(line + "\n" for line in lines)).encode()


# victoria-metrics' CSV: a field with a comma, quote or line break is a JSON string
EXPORT = rows('3,7,0,1000,0.5,"a,b"', '3,7,0,2000,0.75,"a,b"', '1,7,1,2000,2,plain',
              '1,7,1,1000,1,plain', r'2,-1,0,1500,NaN,"say \"hi\""', '2,-1,0,1500,+Inf,x',
              r'2,-1,0,1400,3,"multi\nline"', r'2,-1,1,1400,3,"\\"', r'2,-1,2,1400,3,"\""',
              '2,-1,3,1400,3,back\\slash\\')


def decoded(data: bytes, block: int) -> dict:
    columns = CsvColumns(("rank", "stream", "cluster"), ("kernel",))
    for i in range(0, len(data), block):
        columns.feed(data[i:i + block])
    latest = columns.latest()
    return {"rank": latest.ints["rank"].tolist(), "stream": latest.ints["stream"].tolist(),
            "cluster": latest.ints["cluster"].tolist(),
            "kernel": latest.texts["kernel"].strings(), "value": latest.values.tolist()}


def test_short_texts_read_alike_whatever_the_blocks():
    # every text at most 8 bytes: read a word each (not at a block's very end)
    data = rows(r'1,7,0,1000,0.5,"\""', "1,7,0,2000,0.5,ab", "0,7,0,1000,1,ab", '0,7,1,1000,1,","',
                "0,7,2,1000,1,12345678", "2,7,0,1000,1,ab")
    whole = decoded(data, len(data))
    assert whole["kernel"] == ["ab", ",", "12345678", '"', "ab", "ab"]
    assert whole["rank"] == [0, 0, 0, 1, 1, 2] and whole["cluster"] == [0, 1, 2, 0, 0, 0]
    for block in range(1, len(data) + 1):
        assert decoded(data, block) == whole


def test_each_series_last_sample_ordered_by_labels_whatever_the_blocks():
    whole = decoded(EXPORT, len(EXPORT))
    assert whole["rank"] == [1, 2, 2, 2, 2, 2, 2, 3]
    assert whole["stream"] == [7, -1, -1, -1, -1, -1, -1, 7]
    assert whole["cluster"] == [1, 0, 0, 0, 1, 2, 3, 0]
    assert whole["kernel"] == ["plain", "multi\nline", 'say "hi"', "x", "\\", '"',
                               "back\\slash\\", "a,b"]
    assert whole["value"][0] == 2.0 and whole["value"][-1] == 0.75  # the later sample
    assert np.isnan(whole["value"][2]) and whole["value"][3] == float("inf")
    for block in range(1, len(EXPORT) + 1):  # every way an answer can arrive in pieces
        again = decoded(EXPORT, block)
        assert again["kernel"] == whole["kernel"] and again["rank"] == whole["rank"]
        assert np.array_equal(again["value"], whole["value"], equal_nan=True)


def test_a_row_without_end_is_refused_once_it_passes_the_bound():
    columns = CsvColumns(("rank",), ("kernel",))
    columns.feed(b'1,1000,0.5,k\n2,1000,0.5,"')  # a quoted name that never ends
    with pytest.raises(CsvError, match=f"row 2 is longer than {MAX_ROW_BYTES} bytes"):
        for _ in range(MAX_ROW_BYTES // 65536 + 1):  # newlines inside its quotes end nothing
            columns.feed(b"x\n" * 32768)


def test_an_empty_export_is_no_series():
    columns = CsvColumns(("rank",), ("kernel",))
    columns.feed(b"")
    latest = columns.latest()
    assert len(latest) == 0 and latest.texts["kernel"].values == []


@pytest.mark.parametrize("data, message", [
    (rows("1,7,0,1000,0.5,k", "1,7,1000,0.5,k"), "row 2 has 5 fields, expected 6"),
    (rows("1,7,0,1000,0.5,k,extra"), "row 1 has 7 fields, expected 6"),
    (rows("1,7,0,1000,0.5,k", "r1,7,0,1000,0.5,k"), "row 2: rank='r1' is not an integer"),
    (rows("1,,0,1000,0.5,k"), "row 1: stream='' is not an integer"),
    (rows("1,7,0,1000,fast,k"), "row 1: the value b'fast' is not a number"),
    (b"1,7,0,1000,0.5,k", "the export ends inside a row"),
    (rows('1,7,0,1000,0.5,"open'), "the export ends inside a row"),
    (rows('1,7,0,1000,0.5,"not json\\x"'), "neither a JSON string nor UTF-8 text"),
])
def test_a_bad_export_is_named_by_its_row(data, message):
    columns = CsvColumns(("rank", "stream", "cluster"), ("kernel",))
    with pytest.raises(CsvError, match=message.replace("(", r"\(").replace("[", r"\[")):
        columns.feed(data)
        columns.latest()


# --- against a real victoria-metrics


@pytest.fixture(scope="module")
def victoria(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as url:
        now_ms = int(time.time() * 1000)
        lines = []
        for rank in range(12):
            for k, kernel in enumerate(AWKWARD):
                for cluster in (0, 1):
                    labels = {"job": JOB, "rank": str(rank), "stream": "7",
                              "cluster": str(cluster), "kernel": kernel}
                    count = rank * 100 + k * 2 + cluster + 1
                    # two scrapes 15 s apart: the later one is the current value
                    stamps = [now_ms - 20_000, now_ms - 5_000]
                    lines.append({"metric": {"__name__": "argus_kernel_executions", **labels},
                                  "values": [count - 1, count], "timestamps": stamps})
                    for q, scale in (("0.5", 1.0), ("0.99", 3.0)):
                        seconds = scale * (1 + rank + k / 100 + cluster / 1000) * 1e-5
                        lines.append({"metric": {"__name__": "argus_kernel_duration_seconds",
                                                 "quantile": q, **labels},
                                      "values": [seconds / 2, seconds],
                                      "timestamps": stamps})
        import_series(url, lines)
        api = PrometheusAPI(url, timeout_s=60)
        deadline = time.monotonic() + 120
        while len(api.query(f'argus_kernel_executions{{job="{JOB}"}}')) < len(lines) // 3:
            assert time.monotonic() < deadline, "the imported series never became searchable"
            time.sleep(0.2)
        yield url


def as_rows(columns, texts) -> set:
    keys = zip(*(columns.ints[n].tolist() for n in SUMMARY_INTS),
               *(columns.texts[n].strings() for n in texts), columns.values.tolist(),
               strict=True)
    return set(keys)


@pytest.mark.parametrize("metric, texts", [("argus_kernel_executions", ("kernel",)),
                                           ("argus_kernel_duration_seconds", SUMMARY_TEXTS)])
def test_the_export_reads_what_the_query_reads(victoria, metric, texts):
    api = PrometheusAPI(victoria, timeout_s=60)
    selector = f'{metric}{{job="{JOB}"}}'
    queried = api.query_columns(selector, SUMMARY_INTS, texts, finite_only=False)
    exported = api.export_columns(selector, LOOKBACK_S, SUMMARY_INTS, texts, finite_only=False)
    assert len(exported) == len(queried) == 12 * len(AWKWARD) * 2 * len(texts)
    assert as_rows(exported, texts) == as_rows(queried, texts)
    assert set(exported.texts["kernel"].values) == set(AWKWARD)


def test_the_export_gives_the_queries_summary_table(victoria):
    api = PrometheusAPI(victoria, timeout_s=60)
    coords = {r: (0, 0, r % 3, 0) for r in range(12)}  # three pipeline stages
    match = f'job="{JOB}"'
    for owns in (None, lambda p: p == 1):
        queried, q_sample, q_sets = fetch_summaries(api, match, coords, "pp", 60 * 10**9,
                                                    owns, np.array([0, 1, 2]))
        exported, e_sample, e_sets = fetch_summaries(api, match, coords, "pp", 60 * 10**9,
                                                     owns, np.array([0, 1, 2]),
                                                     export_lookback_s=LOOKBACK_S)
        assert q_sets == e_sets
        for a, b in ((queried, exported), (q_sample, e_sample)):
            if a is None:
                assert b is None
                continue
            assert len(a.rank) and set(a.names) == set(b.names)
            assert table(a) == table(b)
    assert api.decode_fallbacks == 0


def table(summary) -> set:
    """A summary's rows, kernels by name (row order and kernel ids are the reader's own)."""
    return set(zip(summary.rank.tolist(), [summary.names[k] for k in summary.kernel.tolist()],
                   summary.stream.tolist(), summary.cluster.tolist(), summary.count.tolist(),
                   summary.p50_ns.tolist(), summary.p99_ns.tolist(), strict=True))


def test_an_export_past_the_answer_bound_is_refused(victoria):
    api = PrometheusAPI(victoria, timeout_s=60, max_answer_bytes=4096, attempts=1)
    with pytest.raises(QueryError, match="longer than the scorer's bound of 4096 bytes") as caught:
        api.export_columns(f'argus_kernel_duration_seconds{{job="{JOB}"}}', LOOKBACK_S,
                           SUMMARY_INTS, SUMMARY_TEXTS)
    assert caught.value.reason == TOO_LARGE


def test_a_lookback_that_holds_no_sample_reads_nothing(victoria):
    api = PrometheusAPI(victoria, timeout_s=60)
    assert len(api.export_columns(f'argus_kernel_executions{{job="{JOB}"}}', 1.0,
                                  SUMMARY_INTS, ("kernel",))) == 0


# --- against a hostile engine: bounded in time and size, stoppable, never a partial answer


class HostileExport:
    """Answers every export the way a broken engine or an attacker would: ``act(handler)``."""

    def __init__(self):
        self.act = None
        self.serving = threading.Event()  # an answer is under way
        self.sent = 0
        self.done = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.serving.set()
                try:
                    owner.act(owner, self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the scorer hung up
                finally:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


def chunked(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/csv")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


ROW = b"1,7,0,1000,0.5,0.5,kernel\n"


def no_reader_left() -> bool:
    return not any(t.name == "argus-score-read-ahead" for t in threading.enumerate())


def trickled(owner: HostileExport, handler: BaseHTTPRequestHandler) -> None:
    """A row every half second, for a minute at most."""
    chunked(handler)
    until = time.monotonic() + 60
    while not owner.done.wait(0.5) and time.monotonic() < until:
        chunk(handler, ROW)


def endless(owner: HostileExport, handler: BaseHTTPRequestHandler) -> None:
    """Well-formed rows as fast as they are taken, until the scorer hangs up."""
    chunked(handler)
    block = ROW * (MiB // len(ROW))
    while not owner.done.is_set():
        chunk(handler, block)
        owner.sent += len(block)


def cut_mid_row(owner: HostileExport, handler: BaseHTTPRequestHandler) -> None:
    """Some rows, half a row, then the connection closes (no last chunk)."""
    chunked(handler)
    chunk(handler, ROW * 3 + ROW[:9])


def bad_then_stalled(owner: HostileExport, handler: BaseHTTPRequestHandler) -> None:
    """A row that is not the CSV asked for, then nothing more, the connection held open."""
    chunked(handler)
    chunk(handler, ROW + b"not,a,row\n")
    owner.done.wait(60)


@pytest.fixture
def engine():
    hostile = HostileExport()
    yield hostile
    hostile.close()


SELECTOR = 'argus_kernel_duration_seconds{job="x"}'


def export(url: str, **bounds) -> VectorColumns:
    api = PrometheusAPI(url, **{"timeout_s": 2.0, "attempts": 1, **bounds})
    return api.export_columns(SELECTOR, 60.0, SUMMARY_INTS, SUMMARY_TEXTS)


def test_a_trickled_export_is_cut_at_the_deadline(engine):
    engine.act = trickled
    started = time.monotonic()
    with pytest.raises(QueryError, match="no whole answer within --timeout 2 s") as caught:
        export(engine.url)
    assert caught.value.reason == DEADLINE
    assert time.monotonic() - started < 10


def test_an_endless_export_is_refused_at_the_bound_and_reading_stops(engine):
    engine.act = endless
    with pytest.raises(QueryError, match="longer than the scorer's bound of 8 MiB") as caught:
        export(engine.url, timeout_s=60.0, max_answer_bytes=8 * MiB)
    assert caught.value.reason == TOO_LARGE
    sent = engine.sent
    wait_for(no_reader_left, "the read-ahead thread to end")
    time.sleep(0.5)  # nobody reads on: the engine's writes stop once the socket's buffers fill
    assert engine.sent - sent <= 16 * MiB and engine.sent < 64 * MiB


def test_a_bad_row_fails_at_once_and_leaves_no_reader_behind(engine):
    engine.act = bad_then_stalled
    started = time.monotonic()
    with pytest.raises(QueryError, match="row 2 has 3 fields, expected 7") as caught:
        export(engine.url, timeout_s=60.0)
    assert caught.value.reason == BAD_ANSWER and time.monotonic() - started < 10
    wait_for(no_reader_left, "the read-ahead thread to end")


def test_an_export_cut_mid_row_is_a_failed_fetch_not_a_shorter_answer(engine):
    engine.act = cut_mid_row
    with pytest.raises(QueryError) as caught:
        export(engine.url)
    assert caught.value.reason == UNREACHABLE


def test_closing_the_client_ends_an_export_in_flight(engine):
    engine.act = trickled
    api = PrometheusAPI(engine.url, timeout_s=60.0, attempts=1)
    failed: list[QueryError] = []

    def fetch():
        try:
            api.export_columns(SELECTOR, 60.0, SUMMARY_INTS, SUMMARY_TEXTS)
        except QueryError as exc:
            failed.append(exc)

    fetching = threading.Thread(target=fetch)
    fetching.start()
    wait_for(engine.serving.is_set, "the export to begin")
    started = time.monotonic()
    api.close()
    fetching.join(10)
    assert not fetching.is_alive() and time.monotonic() - started < 5
    assert failed and failed[0].reason == STOPPED
    wait_for(no_reader_left, "the read-ahead thread to end")


def test_export_against_prometheus_says_it_needs_victoria_metrics(tmp_path):
    prometheus = Prometheus(tmp_path, {}).start()
    try:
        with pytest.raises(QueryError, match="--read export needs victoria-metrics") as caught:
            export(prometheus.url)
        assert caught.value.reason == HTTP_STATUS
    finally:
        prometheus.stop()


def test_the_lookback_is_the_engines_clock_not_the_scorers(victoria, monkeypatch):
    """A scorer host whose clock runs two hours ahead (more than the lookback) still reads
    the last samples: the export's range is relative, on the engine's clock."""
    ahead = time.time() + 7200
    monkeypatch.setattr(time, "time", lambda: ahead)
    api = PrometheusAPI(victoria, timeout_s=60)
    assert len(api.export_columns(f'argus_kernel_executions{{job="{JOB}"}}', LOOKBACK_S,
                                  SUMMARY_INTS, ("kernel",))) == 12 * len(AWKWARD) * 2


def test_a_job_exported_gives_the_phase_table_the_query_gives(victoria):
    """``fetch_job`` with ``--read export`` reads the ranks' phase, step and CPU-wait windows
    through the export: the same phase table (medians, order, coordinates, hosts, step
    times, collectives' minimums, noise), CPU waits and clock as the instant queries."""
    job, now_ms = "phases-test", int(time.time() * 1000)
    phases = ("attention", "mlp", "dp-allreduce")
    lines = []

    def add(name: str, labels: dict, value: float) -> None:
        lines.append({"metric": {"__name__": name, "job": job, **labels},
                      "values": [value / 2, value], "timestamps": [now_ms - 20_000,
                                                                   now_ms - 5_000]})

    for rank in range(6):
        ident = {"rank": str(rank), "host": f"node-{rank // 2}", "dp": str(rank % 3),
                 "tp": str(rank // 3), "pp": "0", "ep": "0"}
        add("argus_rank_info", ident, 1)
        add("argus_phase_order_info", {"rank": str(rank), "order": ",".join(phases)}, 1)
        add("argus_phase_clock_info", {"rank": str(rank), "clock": "host"}, 1)
        add("argus_step_window_seconds", {**ident, "stat": "median"}, 0.1 + rank / 1000)
        add("argus_step_cpu_wait_window_seconds", {**ident, "stat": "median"}, rank / 1e4)
        add("argus_steps_total", ident, 100 + rank)
        for k, phase in enumerate(phases):
            for stat, scale in (("median", 1.0), ("min", 0.8), ("p25", 0.9), ("p75", 1.2)):
                add("argus_phase_window_seconds", {**ident, "phase": phase, "stat": stat},
                    scale * (0.01 * (k + 1) + rank / 1e5) * (3 if rank == 4 and k == 1 else 1))
    import_series(victoria, lines)
    api = PrometheusAPI(victoria, timeout_s=60)
    wait_for(lambda: len(api.query(f'argus_phase_window_seconds{{job="{job}"}}')) == 72,
             "the imported phase series are searchable", timeout=120)
    queried = fetch_job(api, job, "", 60.0, "2m")
    exported = fetch_job(api, job, "", 60.0, "2m", export_lookback_s=LOOKBACK_S)
    for snapshot in (queried, exported):
        assert snapshot.phases.names == list(phases) and snapshot.host_clock
        assert snapshot.phases.values[4, 1] > 2 * snapshot.phases.values[3, 1]
    a, b = queried.phases, exported.phases
    np.testing.assert_array_equal(a.ranks, b.ranks)
    np.testing.assert_array_equal(a.coords, b.coords)
    assert a.hosts == b.hosts == [f"node-{r // 2}" for r in range(6)]
    for field in ("values", "wall", "minimum", "noise"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert np.isfinite(a.minimum[:, 2]).all() and np.isnan(a.minimum[:, :2]).all()
    assert queried.cpu_wait == exported.cpu_wait and len(queried.cpu_wait) == 6
