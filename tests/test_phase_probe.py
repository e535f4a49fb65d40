"""The phase probe's hot path: shared events, flat per-step slots, bulk resolution.

The same scripted step, on a host clock the test drives and on ``CudaClock`` over a stand-in
``torch.cuda`` whose events run at the driven time, must give exactly the phase times the
step's intervals define (the previous probe's rules: spans from first start to last end,
collectives' waits taken out of the phase they fell in), with fewer events than one per
mark. The ctypes reader of the CUDA runtime must fall back to torch's methods cleanly when
libcudart is missing, and ``bench/exporter_cpu.py`` must report the probe's costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from argus_core.reader import load_traces
from argus_exporters import clock as clock_module
from argus_exporters.clock import (
    CudaClock,
    CudartEvents,
    HostClock,
    TorchEvents,
    event_reader,
    load_cudart,
)
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import Tracer

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = RankIdentity("probe", 0, 1, 0, "node-0", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
EXPECTED_MS = {"forward": 2.0, "dp-allgather": 1.0, "backward": 7.0, "dp-allreduce": 4.0,
               "optimizer": 1.0}


class DrivenHost(HostClock):
    """A host clock whose time (ms) the test sets."""

    def __init__(self):
        self.now_ms = 0.0

    def mark(self, stream=None) -> int:
        return int(self.now_ms * 1e6)


class DrivenCuda:
    """``torch`` with a ``cuda`` whose events complete at once, stamped with the driven time;
    it counts records and live events."""

    def __init__(self):
        self.now_ms = 0.0
        self.records = 0
        self.created = 0
        self.stalled = False  # the device never finishes: events stay incomplete
        driven = self

        class Stream:
            cuda_stream = 7
            device = 0

            def __init__(self, device=0):
                pass

        stream = Stream()

        class Event:
            def __init__(self, enable_timing=True):
                driven.created += 1
                self.t = None

            def record(self, stream=None):
                driven.records += 1
                self.t = driven.now_ms

            def query(self):
                return self.t is not None and not driven.stalled

            def elapsed_time(self, end):
                return end.t - self.t

            def synchronize(self):
                pass

        self.cuda = types.SimpleNamespace(Event=Event, Stream=Stream,
                                          current_stream=lambda: stream,
                                          current_device=lambda: 0)


def scripted_step(tracer: Tracer, clock) -> None:
    """Forward 0-3 ms with a synchronous all-gather at 1-2 inside it, backward 3-10 with two
    gradient buckets (5-6 and 7-9: one span of 4 ms), optimizer 10-11, the step closed at 11.
    Nothing happens between a phase's end and the next phase's start."""
    def at(ms):
        clock.now_ms = ms

    base = clock.now_ms

    def t(ms):
        at(base + ms)

    forward = tracer.begin_phase("forward")
    t(1)
    gather = tracer.begin_phase("dp-allgather", collective=True)
    t(2)
    tracer.end_collective(gather)
    t(3)
    tracer.end_phase(forward)
    backward = tracer.begin_phase("backward")
    t(5)
    first = tracer.begin_phase("dp-allreduce", span=True)
    t(6)
    tracer.end_phase(first)
    t(7)
    second = tracer.begin_phase("dp-allreduce", span=True)
    t(9)
    tracer.end_phase(second)
    t(10)
    tracer.end_phase(backward)
    optimizer = tracer.begin_phase("optimizer")
    t(11)
    tracer.end_phase(optimizer)
    tracer.step()
    t(12)


def run(tmp_path, clock, driven, steps: int = 3) -> list[dict]:
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05), IDENTITY,
                    clock=clock)
    for _ in range(steps):
        scripted_step(tracer, driven)
        tracer.poll()
    tracer.shutdown()
    lines = [json.loads(line) for f in sorted(tmp_path.rglob("*.ndjson"))
             for line in f.read_text().splitlines()]
    return [r for r in lines if r["kind"] == "step"]


def test_host_clock_gives_each_phase_its_own_time(tmp_path):
    driven = DrivenHost()
    records = run(tmp_path, driven, driven)
    assert [r["step"] for r in records] == [0, 1, 2]
    for record in records:
        assert {k: round(v * 1e3, 6) for k, v in record["phases"].items()} == EXPECTED_MS
        assert list(record["phases"]) == list(EXPECTED_MS)  # in the order they started
        assert record["gpu_s"] == 0.011
    assert load_traces([tmp_path]).traces["probe"].steps.phase_names == list(EXPECTED_MS)


def test_device_clock_shares_events_and_gives_the_same_records(tmp_path):
    """On CUDA events: the same phases and gpu_s as on the host clock, exactly; a phase's end
    and the next start share one event, a span's later parts reuse its events: 8 events a
    step for 13 marks (the previous probe recorded 14), all returned to the pool."""
    host = DrivenHost()
    expected = run(tmp_path / "host", host, host)
    device = DrivenCuda()
    clock = CudaClock(device, pool_size=32, events="torch")
    records = run(tmp_path / "device", clock, device)
    assert [(r["phases"], r["gpu_s"]) for r in records] == [
        (r["phases"], r["gpu_s"]) for r in expected]
    assert all("gpu_t_ns" in r for r in records)
    assert device.records == 3 * 9 + 1  # 9 records a step (a span end twice), one anchor
    assert len(clock._pool) == 32  # every step's 8 distinct events came back


def test_without_sharing_the_device_clock_gives_the_same_records(tmp_path):
    device = DrivenCuda()
    tracer_records = run(tmp_path / "a", CudaClock(device, pool_size=32, events="torch"),
                         device)
    device_unshared = DrivenCuda()
    clock = CudaClock(device_unshared, pool_size=32, events="torch")
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}/b", flush_s=0.05),
                    IDENTITY, clock=clock, share_marks=False)
    scripted_step(tracer, device_unshared)
    tracer.shutdown()
    unshared = [json.loads(line) for f in (tmp_path / "b").rglob("*.ndjson")
                for line in f.read_text().splitlines() if '"step"' in line]
    assert unshared[0]["phases"] == tracer_records[0]["phases"]
    assert device_unshared.records == 12 + 1  # one event per mark, and the anchor


def test_a_stalled_device_drops_the_oldest_steps_and_recycles_their_events(tmp_path):
    """The device never completes: the queue stays bounded, the oldest steps are dropped as
    gpu_lag, and their events go back to the pool (no allocation per step)."""
    device = DrivenCuda()
    device.stalled = True
    clock = CudaClock(device, pool_size=64, events="torch")
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05,
                             pending_steps=8), IDENTITY, clock=clock)
    for _ in range(40):
        scripted_step(tracer, device)
    assert len(tracer._pending) <= 8
    assert tracer.health.dropped["gpu_lag"] >= 40 - 8 - 1
    created = device.created
    for _ in range(40):
        scripted_step(tracer, device)
    assert device.created == created  # the pool was enough: dropped steps' events came back
    device.stalled = False
    tracer.shutdown()


class FakeRuntime:
    """A CUDA runtime for ``CudartEvents``: events by handle, completion and error codes."""

    def __init__(self):
        self.times = {}
        self.ready = set()
        self.code = 0

        def query(handle):
            return 0 if handle in self.ready else 600

        def elapsed(ms, start, end):
            if self.code:
                return self.code
            ms._obj.value = self.times[end] - self.times[start]
            return 0

        self.cudaEventQuery, self.cudaEventElapsedTime = query, elapsed


def test_the_ctypes_reader_reads_handles_and_reports_cuda_errors():
    runtime = FakeRuntime()
    reader = CudartEvents(runtime)
    a, b = types.SimpleNamespace(cuda_event=11), types.SimpleNamespace(cuda_event=12)
    runtime.times.update({11: 1.0, 12: 3.5})
    runtime.ready.add(11)
    assert reader.query(a) and not reader.query(b)
    assert reader.elapsed_ms(a, b) == 2.5
    runtime.code = 400  # cudaErrorInvalidResourceHandle: an anchor on another device
    with pytest.raises(RuntimeError, match="400"):
        reader.elapsed_ms(a, b)


def test_each_reading_thread_is_set_to_the_events_device_once():
    """The runtime would make a context on device 0 for a thread that never set one: the
    reader sets each thread it reads on to the device of the clock's marks, once."""
    import threading

    runtime = FakeRuntime()
    calls = []
    runtime.cudaSetDevice = lambda device: calls.append((threading.get_ident(), device)) or 0
    reader = CudartEvents(runtime)
    event = types.SimpleNamespace(cuda_event=5)
    reader.query(event)
    assert calls == []  # no device known yet: nothing set
    reader.bind(3)
    reader.query(event)
    reader.query(event)
    worker = threading.Thread(target=reader.query, args=(event,))
    worker.start()
    worker.join()
    assert [device for _, device in calls] == [3, 3] and calls[0][0] != calls[1][0]


def test_the_reader_falls_back_to_torch_without_libcudart(monkeypatch):
    assert load_cudart(["/nonexistent/libcudart.so.99", "libno-such-cudart.so"]) is None
    monkeypatch.setattr(clock_module, "load_cudart", lambda candidates=None: None)
    assert isinstance(event_reader("auto"), TorchEvents)
    device = DrivenCuda()  # real torch events have raw handles; these do not
    clock = CudaClock(device, pool_size=2)
    assert isinstance(clock.reader, TorchEvents)
    mark = clock.mark()
    device.now_ms = 2.0
    end = clock.mark()
    assert clock.ready_all([mark, end]) and clock.offsets([mark, end]) == [0.0, 0.002]


def test_a_loadable_libcudart_has_what_the_reader_calls():
    library = load_cudart()
    if library is None:
        pytest.skip("no libcudart on this machine")
    reader = CudartEvents(library)  # argtypes set; no call without a GPU
    assert reader.releases_gil and reader.library is library


def bench(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "exporter_cpu.py"), *args,
                           "--json"], capture_output=True, text=True, timeout=120, check=True,
                          cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_exporter_cpu_bench_reports_the_probe_costs():
    """A short run: the new fields exist and are sane (the targets live in the benchmarks)."""
    result = bench("--steps", "300", "--pairs", "2", "--probe-steps", "100",
                   "--probe-pairs", "2")
    for field in ("train_thread_us_per_step", "resolver_gil_us_per_step",
                  "train_thread_us_per_mark"):
        assert 0 < abs(result[field]) < 10_000, (field, result[field])
    assert result["resolver_gil_us_per_step"] > 0
    assert result["probe_reader"] == "cudart"
    assert result["probe_bulk_reader"] is True  # CI has a C compiler: the batch path is measured
    assert result["probe_event_records_per_step"] == 5 + result["probe_buckets"]
    assert result["torch_reader"]["resolver_gil_us_per_step"] > 0
    assert result["records_shipped"] > 0 and not result["dropped"]


def test_exporter_cpu_bench_splits_a_collectives_cost_into_its_parts():
    """``--collectives-only --collective-parts``: the hooks' cost per call each way, as a job
    gets them (their C wrappers: CI has a compiler and Python's headers) and with their
    Python wrappers in the same run, the wrappers' alone, and the tracer's begin, end and
    step close each timed in place and hot."""
    result = bench("--collectives-only", "--collective-parts", "--collective-pairs", "2",
                   "--collective-calls", "20")
    assert result["collective_hooks"] == "native"
    for kind in ("sync", "async", "functional", "graph"):
        assert result[f"collective_{kind}_baseline_cpu_us"] > 0
        assert f"collective_{kind}_wrappers_cpu_us" in result
        assert f"collective_{kind}_python_overhead_cpu_us" in result
        assert result[f"collective_{kind}_native_vs_python"] == (
            result[f"collective_{kind}_overhead_cpu_us"]
            / result[f"collective_{kind}_python_overhead_cpu_us"])
    for part in ("begin", "end", "close"):
        for where in ("beside_gloo", "hot"):
            assert 0 < result[f"collective_{part}_{where}_us"] < 1_000, (part, where)
    assert 0 < result["collective_recording_hot_cpu_us"] < 1_000


def test_exporter_cpu_bench_measures_a_previous_probe_from_git():
    result = bench("--probe-only", "--probe-steps", "100", "--probe-pairs", "2")
    assert result["probe_event_reads_per_step"] > 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if head.returncode:
        pytest.skip("not a git checkout")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "exporter_cpu.py"),
                           "--probe-only", "--probe-steps", "100", "--probe-pairs", "2",
                           "--against", "HEAD", "--against-rounds", "1", "--json"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    against = json.loads(done.stdout.strip().splitlines()[-1])["against"]
    assert against["against_commit"] == head.stdout.strip()
    assert against["ratio_train_thread_us_per_step"] is not None
    assert against["previous_resolver_gil_us_per_step"] > 0


# ---- the bulk event reader (exporters/_native/events.c) ------------------------------------

@pytest.fixture
def c_runtime(tmp_path):
    """bench/standin_cudart.c built: a C CUDA runtime over a table of timestamps."""
    import ctypes

    from argus_exporters._native.build import build

    library = ctypes.CDLL(str(build(tmp_path, source=ROOT / "bench" / "standin_cudart.c")))
    stamps = (ctypes.c_longlong * 64)()
    library.argus_standin_bind(stamps)
    library.stamps = stamps  # kept alive with the library
    return library


def _c_counter(library, name):
    import ctypes

    return (ctypes.c_int if name == "argus_standin_error" else ctypes.c_long).in_dll(library,
                                                                                     name)


def test_the_bulk_reader_reads_a_batch_in_one_call_as_one_call_each_would(c_runtime, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("ARGUS_CACHE_DIR", str(tmp_path / "cache"))
    events = [types.SimpleNamespace(cuda_event=i) for i in range(1, 9)]
    for i, stamp in enumerate([0, 1_500_000, 2_000_000, 7_250_000, 7_250_000, 9_000_000,
                               9_500_000, 12_000_000], start=1):
        c_runtime.stamps[i] = stamp
    bulk, single = CudartEvents(c_runtime), CudartEvents(c_runtime, bulk=None)
    reads = _c_counter(c_runtime, "argus_standin_reads")
    starts, ends = events[:1] * 7, events[1:]
    expected = [single.elapsed_ms(a, b) for a, b in zip(starts, ends, strict=True)]
    assert expected == pytest.approx([1.5, 2.0, 7.25, 7.25, 9.0, 9.5, 12.0])
    before = reads.value
    assert bulk.elapsed_pairs(starts, ends) == expected
    assert bulk._bulk is not None  # the batch went through events.c, not one call each
    assert reads.value - before == 7
    assert bulk.ready_count(events) == 8
    _c_counter(c_runtime, "argus_standin_pending_from").value = 4  # events 4.. not done yet
    assert bulk.ready_count(events) == 3 == single.ready_count(events)
    _c_counter(c_runtime, "argus_standin_error").value = 400
    with pytest.raises(RuntimeError, match="CUDA error 400"):
        bulk.elapsed_pairs(starts, ends)


def test_without_a_compiler_the_reader_reads_one_event_a_call(c_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv("ARGUS_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("ARGUS_EVENTS_LIB", raising=False)
    reader = CudartEvents(c_runtime)
    a, b = types.SimpleNamespace(cuda_event=1), types.SimpleNamespace(cuda_event=2)
    c_runtime.stamps[1], c_runtime.stamps[2] = 0, 3_000_000
    assert reader.elapsed_pairs([a], [b]) == [3.0] and reader._bulk is None
    assert reader.ready_count([a, b]) == 2


def test_a_python_runtime_is_never_handed_to_the_bulk_reader():
    runtime = FakeRuntime()
    reader = CudartEvents(runtime)
    a, b = types.SimpleNamespace(cuda_event=11), types.SimpleNamespace(cuda_event=12)
    runtime.times.update({11: 1.0, 12: 3.5})
    runtime.ready.add(11)
    assert reader.elapsed_pairs([a], [b]) == [2.5] and reader._bulk is None
    assert reader.ready_count([a, b]) == 1


def test_a_tracer_batches_its_device_reads_and_gives_the_same_records(tmp_path):
    """The resolver reads a poll's steps in one batch (readiness, offsets, epoch times): the
    records equal those of one read a call, step for step."""
    records = {}
    for name, bulk in (("batch", "auto"), ("single", None)):
        cuda = DrivenCuda()
        clock = CudaClock(cuda, pool_size=8, events=TorchEvents())
        clock.reader = _CountingBatches(clock.reader, batch=bulk == "auto")
        spool = tmp_path / name
        tracer = Tracer(Settings(enabled=True, sink=f"file://{spool}", flush_s=0.05),
                        IDENTITY, clock=clock)
        with tracer._poll_lock:  # park the resolver: the steps wait, then resolve together
            for _ in range(5):
                scripted_step(tracer, cuda)
        assert tracer.poll() == 5
        tracer.shutdown()
        records[name] = [r for r in _records(spool) if r["kind"] == "step"]
        if bulk == "auto":
            assert clock.reader.batches == {"ready": 1, "elapsed": 2}  # offsets, then epochs
    def device_view(steps):  # host times differ from run to run; device times may not
        return [(r["step"], r["phases"], r["gpu_s"], r["gpu_t_ns"] - steps[0]["gpu_t_ns"])
                for r in steps]

    assert device_view(records["batch"]) == device_view(records["single"])
    assert len(records["batch"]) == 5


class _CountingBatches:
    """A reader that counts its batch calls (or, with ``batch`` false, has none)."""

    def __init__(self, inner, batch: bool):
        self.inner = inner
        self.query, self.elapsed_ms = inner.query, inner.elapsed_ms
        self.batches = {"ready": 0, "elapsed": 0}
        if batch:
            self.ready_count, self.elapsed_pairs = self._ready, self._pairs

    def _ready(self, events):
        self.batches["ready"] += 1
        return self.inner.ready_count(events)

    def _pairs(self, starts, ends):
        self.batches["elapsed"] += 1
        return self.inner.elapsed_pairs(starts, ends)


def _records(spool):
    return [json.loads(line) for path in sorted(Path(spool).rglob("*.ndjson"))
            for line in path.read_text().splitlines()]


def test_the_current_stream_is_built_again_only_when_it_changed():
    """torch.cuda.current_stream() builds a Stream in Python each call; CudaClock keeps the
    last one while the runtime's raw current stream and device (two C calls) say it is still
    current, and builds a new one when the thread switched streams or devices."""

    class Stream:
        def __init__(self, device, handle):
            self.device, self.cuda_stream = device, handle

    state = {"device": 0, "handle": {0: 0, 1: 0}, "built": 0}

    def current_stream():
        state["built"] += 1
        return Stream(state["device"], state["handle"][state["device"]])

    torch = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_getDevice=lambda: state["device"],
                                 _cuda_getCurrentRawStream=lambda d: state["handle"][d]),
        cuda=types.SimpleNamespace(current_stream=current_stream))
    clock = CudaClock(torch, pool_size=0, events=TorchEvents())
    first = clock.current_stream()
    assert all(clock.current_stream() is first for _ in range(5)) and state["built"] == 1
    state["handle"][0] = 0x7F00  # `with torch.cuda.stream(side):`
    side = clock.current_stream()
    assert side is not first and side.cuda_stream == 0x7F00 == clock.stream_key()
    state["device"] = 1  # torch.cuda.set_device(1): its default stream has handle 0 too
    other = clock.current_stream()
    assert other.device == 1 and other.cuda_stream == 0 and state["built"] == 3
    assert clock.current_stream() is other and state["built"] == 3


class _RefusingReader(TorchEvents):
    """Torch's methods, except that CUDA refuses any elapsed time ending at a ``bad`` event
    (an event of another device, or destroyed)."""

    def __init__(self):
        self.bad: set[int] = set()

    def elapsed_ms(self, start, end):
        if id(end) in self.bad:
            raise RuntimeError("CUDA error: invalid resource handle")
        return super().elapsed_ms(start, end)

    def elapsed_pairs(self, starts, ends):
        return [self.elapsed_ms(start, end) for start, end in zip(starts, ends, strict=True)]


def test_a_step_whose_events_cuda_refuses_is_dropped_and_counted_not_raised(tmp_path):
    """One step of a batch with an event CUDA will not read: the others are resolved, that
    one is dropped as ``device_read_error``, and neither training nor the resolver sees the
    error."""
    cuda = DrivenCuda()
    clock = CudaClock(cuda, pool_size=64, events=_RefusingReader())
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05), IDENTITY,
                    clock=clock)
    with tracer._poll_lock:  # park the resolver: the three steps resolve in one batch
        for index in range(3):
            scripted_step(tracer, cuda)
            if index == 1:  # every mark of step 1 after its first
                clock.reader.bad.update(id(m) for m in tracer._pending[-1].marks[1:])
    assert tracer.poll() == 2
    tracer.shutdown()
    steps = [r["step"] for r in _records(tmp_path) if r["kind"] == "step"]
    assert steps == [0, 2] and tracer.health.dropped == {"device_read_error": 1}


def test_the_resolver_readies_the_bulk_reader_before_any_step(c_runtime, tmp_path, monkeypatch):
    """The bulk event reader is found (or built) by the resolver thread when it starts, so
    the training thread's first inline poll never waits for a compiler."""
    import threading
    import time

    monkeypatch.setenv("ARGUS_CACHE_DIR", str(tmp_path / "cache"))
    reader = CudartEvents(c_runtime)
    loaded_on = []
    load = reader._bulk_reader

    def recording_load():
        loaded_on.append(threading.current_thread().name)
        return load()

    reader._bulk_reader = recording_load
    clock = CudaClock(DrivenCuda(), pool_size=8, events=reader)
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}/spool", flush_s=0.05),
                    IDENTITY, clock=clock)
    deadline = time.monotonic() + 60
    while reader._bulk is None and time.monotonic() < deadline:
        time.sleep(0.01)
    tracer.shutdown()
    assert reader._bulk is not None and loaded_on[0] == "argus-resolver"
