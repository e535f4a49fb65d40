"""The scorer's columnar decoding of Prometheus's answers (score/vector_columns.py) against
``json.loads`` and the rebuild as it was (a dict per series): the same summary table, bit for
bit, on generated answers with awkward label values, missing and unsorted series, extra labels,
empty results and NaN/Inf; anything not in Prometheus's layout is read as JSON and counted."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import compress
from operator import itemgetter, methodcaller

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import free_port

from argus_core.score.prometheus import PrometheusAPI, QueryError, read_columns
from argus_core.score.snapshot import SUMMARY_INTS, SUMMARY_TEXTS, kernel_summary
from argus_core.score.vector_columns import columns_from_result, decode_vector, json_numbers
from argus_core.summaries import KernelSummary

WINDOW_NS = 60_000_000_000
# Kernel names as profilers report them: templates, namespaces, lambdas, and the worst a
# label can hold (quotes, backslashes, control characters, non-ASCII, JSON-looking text).
AWKWARD = ['void at::native::elementwise_kernel<128, 4, at::native::{lambda(int)#1}>(int)',
           'ncclDevKernel_AllReduce_Sum_bf16_RING_LL', 'say "hi"', 'back\\slash\\',
           'tab\tnew\nline', 'ünïcödé 核函数 🚀', 'a & b < c > d', '{"metric":{"x":"y"}}',
           'colon:"quoted"', 'line\u2028sep', '', 'x,"value":[1,"2"]}']


# --- the rebuild as it was on main (a dict per series), the reference the columns must equal

def _label_columns(result, names):
    metrics = list(map(itemgetter("metric"), result))
    columns = [list(map(methodcaller("get", name, ""), metrics)) for name in names]
    values = np.fromiter(map(float, map(itemgetter(1), map(itemgetter("value"), result))),
                         np.float64, len(result))
    return columns, values


def _ints(texts):
    return np.fromiter(map(int, texts), np.int64, len(texts))


_KEY = itemgetter("rank", "kernel", "stream", "cluster")


def reference_summary(executions, durations, window_ns, names=None) -> KernelSummary:
    names = {} if names is None else names
    keys = list(map(_KEY, map(itemgetter("metric"), executions)))
    d_keys = list(map(_KEY, map(itemgetter("metric"), durations)))
    _, counts = _label_columns(executions, ())
    (quantile,), seconds = _label_columns(durations, ("quantile",))
    q = np.array(quantile)
    is50, is99 = q == "0.5", q == "0.99"
    if list(compress(d_keys, is50.tolist())) == keys == \
            list(compress(d_keys, is99.tolist())):
        unique, count = keys, counts
        p50, p99 = seconds[is50] * 1e9, seconds[is99] * 1e9
    else:
        index = {key: i for i, key in enumerate(dict.fromkeys(keys + d_keys))}
        unique = list(index)
        count, p50, p99 = (np.full(len(index), np.nan) for _ in range(3))
        count[np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))] = counts
        rows = np.fromiter(map(index.__getitem__, d_keys), np.int64, len(d_keys))
        p50[rows[is50]] = seconds[is50] * 1e9
        p99[rows[is99]] = seconds[is99] * 1e9
    n = len(unique)
    rank = _ints([k[0] for k in unique])
    kernel = np.fromiter((names.setdefault(k[1], len(names)) for k in unique), np.int64, n)
    stream = _ints([k[2] for k in unique])
    cluster = _ints([k[3] for k in unique])
    with np.errstate(invalid="ignore"):
        ok = (count > 0) & (p50 > 0) & (p99 >= p50)
    count = count[ok].astype(np.int64)
    return KernelSummary(rank=rank[ok], kernel=kernel[ok], stream=stream[ok],
                         window=np.zeros(int(ok.sum()), dtype=np.int64), cluster=cluster[ok],
                         count=count, sum_ns=count * p50[ok], p50_ns=p50[ok], p99_ns=p99[ok],
                         names=sorted(names, key=names.get), window_ns=window_ns)


# --- answers written as Prometheus writes them

def go_string(text: str, ascii_only: bool) -> str:
    """A JSON string as Go's encoder writes it (<, >, &, U+2028/9 escaped)."""
    out = json.dumps(text, ensure_ascii=ascii_only)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        out = out.replace(char, escape)
    return out


def sample_text(value: float) -> str:
    """A sample value as Prometheus writes it (shortest positional decimal; NaN, +Inf)."""
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return np.format_float_positional(value, trim="-")


def answer(series: list[tuple[dict, float]], ascii_only: bool = False,
           sort_labels: bool = True) -> bytes:
    """An instant-vector answer holding ``series`` (labels, value)."""
    rows = []
    for labels, value in series:
        items = sorted(labels.items()) if sort_labels else list(labels.items())
        metric = ",".join(f"{go_string(k, ascii_only)}:{go_string(v, ascii_only)}"
                          for k, v in items)
        rows.append(f'{{"metric":{{{metric}}},"value":[1764547200.123,'
                    f'"{sample_text(value)}"]}}')
    return ('{"status":"success","data":{"resultType":"vector","result":['
            + ",".join(rows) + "]}}").encode()


def summary_series(rng, ranks: int, kernels: list[str], extra: dict | None = None):
    """(executions, durations) series of a job: every rank runs every kernel on 1-2 streams
    in 1-3 clusters, in Prometheus's order (sorted by label values)."""
    executions, durations = [], []
    for rank in range(ranks):
        for kernel in kernels:
            for stream in rng.choice([7, 13, 21], rng.integers(1, 3), replace=False).tolist():
                for cluster in range(int(rng.integers(1, 4))):
                    base = {"__name__": "", "job": "llm", "instance": "proc:9700",
                            "rank": str(rank), "kernel": kernel, "stream": str(stream),
                            "cluster": str(cluster), **(extra or {})}
                    p50 = float(rng.lognormal(-9, 1))
                    executions.append(({**base, "__name__": "argus_kernel_executions"},
                                       float(rng.integers(1, 5000))))
                    for q, v in (("0.5", p50), ("0.99", p50 * float(rng.uniform(1, 3)))):
                        durations.append(({**base, "__name__": "argus_kernel_duration_seconds",
                                           "quantile": q}, v))

    def order(series):
        return sorted(series, key=lambda s: [v for _, v in sorted(s[0].items())])

    return order(executions), order(durations)


def both_ways(executions: bytes, durations: bytes, names=None):
    """(columnar table, which answers fell back, reference table) for the same bytes."""
    e, e_json = read_columns("q", executions, SUMMARY_INTS, ("kernel",))
    d, d_json = read_columns("q", durations, SUMMARY_INTS, SUMMARY_TEXTS)
    fast = kernel_summary(e, d, WINDOW_NS, dict(names or {}))
    slow = reference_summary(orjson.loads(executions)["data"]["result"],
                             orjson.loads(durations)["data"]["result"], WINDOW_NS,
                             dict(names or {}))
    return fast, (e_json, d_json), slow


def assert_same(fast: KernelSummary, slow: KernelSummary) -> None:
    assert fast.names == slow.names
    for name in ("rank", "kernel", "stream", "window", "cluster", "count", "sum_ns", "p50_ns",
                 "p99_ns"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name


@pytest.mark.parametrize("seed", range(12))
def test_columns_equal_json_and_the_old_rebuild(seed):
    """Prometheus's layout, awkward kernel names, plain or \\u-escaped non-ASCII: the
    columnar path is taken and gives the old table bit for bit."""
    rng = np.random.default_rng(seed)
    kernels = list(rng.choice(AWKWARD, int(rng.integers(1, 6)), replace=False))
    executions, durations = summary_series(rng, int(rng.integers(3, 30)), kernels)
    ascii_only = bool(seed % 2)
    fast, fell_back, slow = both_ways(answer(executions, ascii_only),
                                      answer(durations, ascii_only),
                                      names={"already-known": 0} if seed % 3 == 0 else None)
    assert fell_back == (False, False)
    assert_same(fast, slow)
    assert len(fast) == len(executions)


@pytest.mark.parametrize("seed", range(8))
def test_missing_and_unsorted_series_join_as_before(seed):
    """Clusters missing a count, a p50 or a p99 are left out; shuffled answers (another
    store, a proxy) are joined by key; both exactly as the old rebuild did."""
    rng = np.random.default_rng(100 + seed)
    executions, durations = summary_series(rng, int(rng.integers(3, 20)),
                                           list(rng.choice(AWKWARD, 3, replace=False)))
    executions = [s for s in executions if rng.random() > 0.1]
    durations = [s for s in durations if rng.random() > 0.1]
    if seed % 2:
        executions = [executions[i] for i in rng.permutation(len(executions))]
        durations = [durations[i] for i in rng.permutation(len(durations))]
    fast, fell_back, slow = both_ways(answer(executions), answer(durations))
    assert fell_back == (False, False)  # the layout is fine; the join handles the rest
    assert_same(fast, slow)


def test_values_as_prometheus_writes_them():
    """NaN, +Inf, -Inf, integers, tiny and huge values: read as float() reads them (rows
    whose quantiles are not finite and ordered are left out, as before)."""
    values = [0.0, 1.0, 12345.0, 1e-12, 2.5e-7, 123456789.125, float("nan"), float("inf"),
              -float("inf"), -3.5, 0.1, 1 / 3]
    series = [({"__name__": "m", "rank": str(i), "kernel": "k", "stream": "0",
                "cluster": "0", "quantile": "0.5"}, v) for i, v in enumerate(values)]
    data = answer(series)
    columns = decode_vector(data, ("rank",), ("quantile",))
    assert columns is not None
    expected = [float(sample_text(v)) for v in values]
    assert np.array_equal(columns.values, expected, equal_nan=True)
    rng = np.random.default_rng(7)
    executions, durations = summary_series(rng, 5, ["k"])
    durations = [(labels, float(rng.choice([v, np.nan, np.inf, -np.inf, 0.0], p=[.6] + [.1] * 4)))
                 for labels, v in durations]
    fast, fell_back, slow = both_ways(answer(executions), answer(durations))
    assert fell_back == (False, False)
    assert_same(fast, slow)


def test_empty_answers_give_an_empty_table():
    empty = answer([])
    assert len(decode_vector(empty, SUMMARY_INTS, SUMMARY_TEXTS)) == 0
    fast, fell_back, slow = both_ways(empty, empty)
    assert fell_back == (False, False) and len(fast) == 0
    assert_same(fast, slow)


def test_extra_labels_on_every_series_stay_columnar():
    rng = np.random.default_rng(3)
    executions, durations = summary_series(rng, 6, ["k1", "k2"],
                                           extra={"host": "node-0", "zone": "a:b"})
    fast, fell_back, slow = both_ways(answer(executions), answer(durations))
    assert fell_back == (False, False)
    assert_same(fast, slow)


def _extra_on_some(rng, series):
    return [({**labels, "host": "n"} if rng.random() < 0.3 else labels, v)
            for labels, v in series]


@pytest.mark.parametrize("case", ["extra label on some series", "labels not sorted",
                                  "a warning", "pretty printed", "a quoted timestamp"])
def test_other_layouts_are_read_as_json_and_counted(case):
    """What the columnar reader does not recognise is read as JSON, flagged (the API counts
    it in decode_fallbacks), and still gives the old table."""
    rng = np.random.default_rng(11)
    executions, durations = summary_series(rng, 8, ["k1", "k2"])
    if case == "extra label on some series":
        executions, durations = _extra_on_some(rng, executions), _extra_on_some(rng, durations)
    e_data, d_data = answer(executions), answer(durations)
    if case == "labels not sorted":  # in some series only
        e_data = answer([(dict(sorted(lab.items(), reverse=i % 2 == 1)), v)
                         for i, (lab, v) in enumerate(executions)], sort_labels=False)
    if case == "a quoted timestamp":
        e_data = e_data.replace(b'[1764547200.123,', b'["1764547200.123",')
    if case == "a warning":
        e_data = e_data[:-1] + b',"warnings":["too many samples"]}'
    if case == "pretty printed":
        e_data = json.dumps(json.loads(e_data), indent=1).encode()
    fast, fell_back, slow = both_ways(e_data, d_data)
    assert fell_back[0] is True
    assert_same(fast, slow)


class CannedPrometheus:
    """An HTTP endpoint answering every query with the given bytes (a proxy, another
    store): what the scorer's client must cope with."""

    def __init__(self, body: bytes):
        body_ = body

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body_)))
                self.end_headers()
                self.wfile.write(body_)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_client_counts_answers_read_as_json():
    rng = np.random.default_rng(5)
    executions, _ = summary_series(rng, 4, ["k"])
    for body, fallbacks in ((answer(executions), 0),
                            (answer(_extra_on_some(np.random.default_rng(1), executions)), 1)):
        canned = CannedPrometheus(body)
        try:
            api = PrometheusAPI(canned.url, timeout_s=5)
            columns = api.query_columns("argus_kernel_executions", SUMMARY_INTS, ("kernel",))
        finally:
            canned.close()
        assert api.decode_fallbacks == fallbacks
        assert api.series_fetched == len(columns) == len(executions)
        reference = columns_from_result(orjson.loads(body)["data"]["result"], SUMMARY_INTS,
                                        ("kernel",))
        assert np.array_equal(columns.values, reference.values)
        assert all(np.array_equal(columns.ints[k], reference.ints[k]) for k in SUMMARY_INTS)


def test_a_rank_that_is_not_a_number_is_a_clear_error():
    series = [({"__name__": "m", "rank": r, "kernel": "k", "stream": "0", "cluster": "0"}, 1.0)
              for r in ("1", "2", "rank-3")]
    assert decode_vector(answer(series), SUMMARY_INTS, ("kernel",)) is None
    canned = CannedPrometheus(answer(series))
    try:
        api = PrometheusAPI(canned.url, timeout_s=5, backoff_s=0)
        with pytest.raises(QueryError, match="label rank='rank-3' is not an integer"):
            api.query_columns("m", SUMMARY_INTS, ("kernel",))
    finally:
        canned.close()
    assert api.failures == 0  # the answer is what it is: not fetched again


def test_series_with_their_own_timestamps():
    """An instant query's samples share one timestamp; a store that writes each series' own
    (any length) is still read as columns."""
    rng = np.random.default_rng(9)
    executions, durations = summary_series(rng, 6, ["k1", "k2"])
    data = answer(executions)
    parts = data.split(b"[1764547200.123,")
    stamps = [b"17645472", b"1764547200", b"1764547200.5", b"1764547200.123", b"1"]
    data = parts[0] + b"".join(b"[" + stamps[i % len(stamps)] + b"," + part
                               for i, part in enumerate(parts[1:]))
    fast, fell_back, slow = both_ways(data, answer(durations))
    assert fell_back == (False, False)
    assert_same(fast, slow)


def test_one_text_written_two_ways_is_one_value():
    """JSON may escape any character ("k" as "\\u006b"): values are compared decoded."""
    rng = np.random.default_rng(2)
    executions, durations = summary_series(rng, 5, ["k1", "k2"])
    e_data, d_data = answer(executions), answer(durations)
    e_data = e_data.replace(b'"kernel":"k1"', b'"kernel":"\\u006b1"', 3)
    d_data = d_data.replace(b'"quantile":"0.5"', b'"quantile":"0\\u002e5"', 2)
    fast, fell_back, slow = both_ways(e_data, d_data)
    assert fell_back == (False, False)
    assert_same(fast, slow)
    assert fast.names == ["k1", "k2"]


def fields(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bytes of ``texts`` written one after another with a separator, and each's span."""
    data = "".join(f"{t};" for t in texts).encode()
    lengths = np.array([len(t.encode()) + 1 for t in texts], dtype=np.int64)
    start = np.cumsum(lengths) - lengths
    return np.frombuffer(data, dtype=np.uint8), start, start + lengths - 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=40),
       st.sampled_from([repr, lambda x: format(x, ".17g"), lambda x: format(x, "g"),
                        lambda x: format(x, ".3e"), lambda x: str(int(x)) if abs(x) < 1e18 else
                        repr(x)]))
def test_numbers_read_in_one_pass_are_what_float_reads(numbers, write):
    """Any finite number, written as Python, Go or C write them (shortest, 17 digits,
    exponents in either case), reads exactly as ``float()`` reads its text. A text rounded
    past the largest double (``1.798e+308``) is left to ``float()`` (None)."""
    texts = [write(x) for x in numbers]
    expected = [float(t) for t in texts]
    got = json_numbers(*fields(texts))
    if np.isfinite(expected).all():
        assert got is not None
    assert got is None or got.tolist() == expected


@pytest.mark.parametrize("text", ["NaN", "+Inf", "-Inf", "+1", '"1"', "", " 1", ".5", "1.",
                                  "1,2", "0x10", "1_000", "--1"])
def test_numbers_that_are_not_plain_json_are_left_to_float(text):
    """NaN, infinities, a plus sign, quotes, blanks, two numbers in one field: None, so
    that the caller reads each with ``float()`` (and names what it cannot read)."""
    assert json_numbers(*fields(["1.5", text, "2"])) is None


def test_many_numbers_are_read_a_bounded_part_at_a_time():
    """More fields than one pass takes: read in parts, the same numbers; one field that is
    not a plain number anywhere leaves all of them to ``float()``."""
    rng = np.random.default_rng(3)
    texts = [repr(x) for x in rng.lognormal(-8, 3, 150_000).tolist()]
    got = json_numbers(*fields(texts))
    assert got is not None and got.tolist() == [float(t) for t in texts]
    texts[100_000] = "NaN"
    assert json_numbers(*fields(texts)) is None


def test_a_number_that_ends_the_bytes_is_read():
    """A field that runs to the last byte (no separator after it) reads like any other."""
    data = np.frombuffer(b"12.5;0.25", dtype=np.uint8)
    got = json_numbers(data, np.array([0, 5]), np.array([4, 9]))
    assert got is not None and got.tolist() == [12.5, 0.25]
