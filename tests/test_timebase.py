"""One time base for steps and kernels: ``gpu_t_ns`` on CUPTI's clock, on a CPU.

A stand-in for ``torch.cuda`` (events with device timestamps, streams whose work runs a set
time after the host enqueued it, float32 ``elapsed_time`` like CUDA's) drives the real
``CudaClock`` and ``Tracer``. The host runs several ms ahead of the device: kernels, stamped on
the device timeline as CUPTI stamps them, must land in their own step when placed by
``gpu_t_ns``, where host ``t_ns`` puts them steps too late.
"""

from __future__ import annotations

import time as real_time
import types

import numpy as np
import pytest

from argus_core.reader import load_traces
from argus_core.schema import MAX_TIMESTAMP_NS, SchemaError, parse_record
from argus_core.trace import NO_GPU_T
from argus_exporters import tracer as tracer_module
from argus_exporters.clock import CudaClock, HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import Tracer

IDENTITY = RankIdentity("job-t", 0, 1, 0, "node-0", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
EPOCH = 1_790_000_000_000_000_000  # a CLOCK_REALTIME ns value


class Device:
    """Host time (what time.time_ns() returns) and the device that runs behind it."""

    def __init__(self, lag_ns: int):
        self.now = EPOCH
        self.lag_ns = lag_ns  # how far the compute stream's work runs behind the host
        self.events_created = 0

    def now_ns(self) -> int:
        return self.now

    def torch(self) -> types.SimpleNamespace:
        device = self

        class Stream:
            def __init__(self, lag_ns: int = 2_000, device: int | None = None):
                self.lag_ns = lag_ns  # an idle stream: ~2 us to run
                self.device = device_state.current if device is None else device

        device_state = types.SimpleNamespace(current=0)
        device.state = device_state
        compute = Stream(device.lag_ns)

        class Event:
            def __init__(self, enable_timing: bool = False):
                assert enable_timing
                device.events_created += 1
                self.t: int | None = None
                self.device: int | None = None

            def record(self, stream) -> None:
                self.t = device.now + stream.lag_ns
                self.device = stream.device

            def query(self) -> bool:
                return self.t is not None and self.t <= device.now

            def elapsed_time(self, end) -> float:
                assert self.query() and end.query(), "elapsed_time of an incomplete event"
                if self.device != end.device:
                    raise RuntimeError("CUDA error: invalid resource handle")
                return float(np.float32((end.t - self.t) / 1e6))  # ms, float32 like CUDA

            def synchronize(self) -> None:
                device.now = max(device.now, self.t)

        def current_stream():
            compute.device = device_state.current
            return compute

        cuda = types.SimpleNamespace(Event=Event, Stream=Stream, current_stream=current_stream,
                                     current_device=lambda: device_state.current)
        return types.SimpleNamespace(cuda=cuda)


class HostTime:
    """``time`` for the tracer: epoch and monotonic clocks from the Device."""

    def __init__(self, device: Device):
        self.device = device

    def time_ns(self) -> int:
        return self.device.now

    def perf_counter_ns(self) -> int:
        return self.device.now - EPOCH

    thread_time = staticmethod(real_time.thread_time)


def run_job(tmp_path, monkeypatch, lag_ns: int, steps: int, step_ns: int, kernels: int):
    """Steps of ``step_ns`` host time, the device ``lag_ns`` behind; returns the trace and the
    kernels' device start times with the step each belongs to."""
    device = Device(lag_ns)
    monkeypatch.setattr(tracer_module, "time", HostTime(device))
    clock = CudaClock(device.torch(), pool_size=16, now_ns=device.now_ns)
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05),
                    IDENTITY, clock=clock)
    starts, owner = [], []
    for step in range(steps):
        token = tracer.begin_phase("forward")
        device_start = device.now + lag_ns  # the first mark runs here on the device
        starts += [device_start + k * step_ns // (kernels + 1) for k in range(kernels)]
        owner += [step] * kernels
        device.now += step_ns // 2
        tracer.end_phase(token)
        device.now += step_ns - step_ns // 2
        tracer.step()
    device.now += 10 * lag_ns  # the device catches up
    tracer.shutdown()
    trace = load_traces([tmp_path]).traces["job-t"]
    return trace, np.array(starts), np.array(owner)


@pytest.mark.parametrize(("lag_ms", "step_ms"), [(7, 3), (25, 10), (3, 2), (0.5, 4)])
def test_gpu_t_ns_places_kernels_into_their_own_steps(tmp_path, monkeypatch, lag_ms, step_ms):
    lag, step_ns = int(lag_ms * 1e6), int(step_ms * 1e6)
    trace, starts, owner = run_job(tmp_path, monkeypatch, lag, 20, step_ns, kernels=6)
    steps = trace.steps
    assert (steps.step == np.arange(20)).all()
    expected = EPOCH + lag + np.arange(20) * step_ns
    # off by the idle stream's start latency (2 us here, a few us on a GPU), nothing else
    assert np.abs(steps.gpu_t_ns - expected).max() < 10_000
    placed = np.searchsorted(steps.gpu_t_ns, starts, side="right") - 1
    assert (steps.step[placed] == owner).all()
    by_host = np.searchsorted(steps.t_ns, starts, side="right") - 1
    if lag > step_ns:  # the host runs a step or more ahead: t_ns misplaces kernels
        assert (steps.step[by_host] != owner).mean() > 0.5


def test_anchors_are_renewed_so_float32_milliseconds_stay_precise(tmp_path, monkeypatch):
    """Over an hour a single anchor would leave ~0.25 ms steps of float32 ms; renewed anchors
    keep every step's gpu_t_ns within the anchor's few-us latency."""
    device = Device(5_000_000)
    monkeypatch.setattr(tracer_module, "time", HostTime(device))
    clock = CudaClock(device.torch(), pool_size=4, now_ns=device.now_ns, anchor_every_s=10)
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05),
                    IDENTITY, clock=clock)
    expected = []
    for _ in range(60):  # one step a minute for an hour
        token = tracer.begin_phase("forward")
        expected.append(device.now + device.lag_ns)
        device.now += 1_000_000
        tracer.end_phase(token)
        tracer.step()
        device.now += 60 * 10**9
        tracer.poll()  # the resolver reads finished steps (and renews the anchor)
    tracer.shutdown()
    steps = load_traces([tmp_path]).traces["job-t"].steps
    assert np.abs(steps.gpu_t_ns - np.array(expected)).max() < 10_000
    assert len(clock._anchors) > 30


def test_host_clock_steps_have_no_gpu_t_ns(tmp_path):
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05),
                    IDENTITY, clock=HostClock())
    with tracer.phase("forward"):
        pass
    tracer.step()
    tracer.shutdown()
    lines = [line for f in tmp_path.rglob("*.ndjson") for line in f.read_text().splitlines()]
    assert lines and all("gpu_t_ns" not in line for line in lines)
    steps = load_traces([tmp_path]).traces["job-t"].steps
    assert steps.gpu_t_ns.tolist() == [NO_GPU_T]


def test_event_pool_never_raises_when_another_thread_empties_it():
    """Two threads marking at once: the pool's last event is taken between the check and the
    pop. The old check-then-pop raised IndexError into training."""
    device = Device(0)
    clock = CudaClock(device.torch(), pool_size=1, now_ns=device.now_ns)

    class RacedPool(list):
        def __bool__(self) -> bool:  # "not empty" ... then another thread takes the event
            return True

    clock._pool = RacedPool()
    mark = clock.mark()
    assert mark.t is not None
    clock.release(mark)
    assert clock.mark() is mark


# ---- schema v1 ---------------------------------------------------------------------------------

STEP = {"v": 1, "kind": "step", "job": "j", "rank": 0, "step": 3, "t_ns": 10, "wall_s": 0.1,
        "gpu_s": 0.1, "phases": {}}


def test_gpu_t_ns_is_optional_and_validated():
    assert parse_record(STEP).gpu_t_ns is None
    assert parse_record({**STEP, "gpu_t_ns": 12}).gpu_t_ns == 12
    # The same clock as the kernels' start_ns (CUPTI's), so the same bound as every timestamp.
    assert parse_record({**STEP, "gpu_t_ns": MAX_TIMESTAMP_NS}).gpu_t_ns == MAX_TIMESTAMP_NS
    beyond = f"must be <= {MAX_TIMESTAMP_NS}"
    for bad, message in [(-1, ">= 0"), (MAX_TIMESTAMP_NS + 1, beyond), (2**63, beyond),
                         (1.5, "integer"), (True, "integer"), ("12", "integer")]:
        with pytest.raises(SchemaError) as err:
            parse_record({**STEP, "gpu_t_ns": bad})
        assert err.value.field == "gpu_t_ns" and message in err.value.message


def test_anchors_live_on_the_device_of_the_marks(tmp_path, monkeypatch):
    """A tracer created before ``torch.cuda.set_device`` (``argus run`` starts at import)
    anchors on the device its marks use, and a mark no anchor can time gets no gpu_t_ns
    instead of an exception in the resolver."""
    device = Device(4_000_000)
    torch = device.torch()
    clock = CudaClock(torch, pool_size=4, now_ns=device.now_ns)  # on device 0
    device.state.current = 3  # set_device(3), then training starts
    first = clock.mark()
    device.now += 10_000_000
    assert abs(clock.epoch_ns(first) - (EPOCH + 4_000_000)) < 10_000
    device.state.current = 5  # a mark on a device no anchor is on
    stray = clock.mark()
    device.now += 10_000_000
    assert clock.epoch_ns(stray) is None
