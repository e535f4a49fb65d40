"""The kernel probe against the C stand-in for libcupti (tests/cupti_standin), on a CPU.

The stand-in has CUPTI's threading: its own thread calls the buffer callbacks while holding
its lock, and a launch takes that lock. The probe's callbacks are native (torch's, or the Argus
shim), so a training thread that holds the GIL and launches never deadlocks; the old design
(Python callbacks) does, and the stand-in shows it. Runs that could hang run in a subprocess
with a timeout, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cupti_standin import RUNTIME_KIND, Standin, build_once

from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.kernels import (
    CuptiLibrary,
    KernelProbe,
    TorchPlumbing,
    kernel_record_dtypes,
)
from argus_exporters.kernels.plumbing import STOPPED
from argus_exporters.kernels.probe import CLOCK_GAUGE
from argus_exporters.kernels.profilers import PREPARE_REASON
from argus_exporters.metrics import StepMetrics

cupti_module = pytest.importorskip("cupti.cupti")

DTYPES = kernel_record_dtypes()
API = np.dtype(cupti_module.activity_api_dtype)
IDENTITY = RankIdentity(job="j", rank=3, world_size=4, local_rank=3, host="h",
                        coords={"dp": 3, "tp": 0, "pp": 0, "ep": 0})
SCENARIO = Path(__file__).parent / "cupti_standin" / "scenario.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
CALLBACKS = ["shim", pytest.param("torch", marks=pytest.mark.skipif(
    not HAS_TORCH, reason="torch's native callbacks need torch"))]


@pytest.fixture(scope="module")
def standin_path(tmp_path_factory) -> Path:
    return build_once(tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shim-cache")


@pytest.fixture
def standin(standin_path):
    lib = Standin(standin_path, DTYPES[0], API)
    lib.reset()
    yield lib
    lib.reset()


class Run:
    """A probe on the stand-in, shut down at the end of the test."""

    def __init__(self, standin: Standin, cache: Path):
        self.standin, self.cache = standin, cache
        self.probes: list[KernelProbe] = []

    def probe(self, callbacks: str = "shim", emit=None, health: Health | None = None,
              backend: CuptiLibrary | None = None, start: bool = True,
              **overrides) -> tuple[KernelProbe, Health, list]:
        if callbacks == "torch":
            pytest.importorskip("torch")
        base = {"enabled": True, "kernels": True, "kernel_buffer_bytes": 4096,
                "kernel_buffers": 8, "kernel_flush_s": 0.01, "kernel_callbacks": callbacks,
                "extra": {"training_rank": True}}
        health = health or Health()
        out: list = []
        env = {"RANK": "0", "ARGUS_CACHE_DIR": str(self.cache), "PATH": os.defpath}
        probe = KernelProbe(Settings(**{**base, **overrides}), IDENTITY, emit or out.append,
                            health, backend=backend or CuptiLibrary(self.standin.lib, DTYPES),
                            env=env)
        self.probes.append(probe)
        if start:
            assert probe.start(), health.probes
        return probe, health, out


@pytest.fixture
def run(standin, cache):
    runs = Run(standin, cache)
    yield runs
    for probe in runs.probes:
        probe.shutdown()


def kernels_in(records: list[dict]) -> int:
    return int(sum(len(r["start_ns"]) for r in records))


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.002)
    return condition()


# ---- the deadlock, in subprocesses ---------------------------------------------------------------

def scenario(standin_path: Path, cache: Path, callbacks: str, timeout: float,
             *args: int) -> dict:
    done = subprocess.run([sys.executable, str(SCENARIO), str(standin_path), str(cache),
                           callbacks, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("callbacks", CALLBACKS)
def test_launches_holding_the_gil_never_deadlock_and_every_buffer_comes_home(
        callbacks, standin_path, cache):
    """200 steps of launches that keep the GIL while the stand-in's thread holds its lock and
    calls the probe's callbacks: the run ends, every kernel is emitted or counted as dropped,
    and every buffer CUPTI was lent came back."""
    result = scenario(standin_path, cache, callbacks, 120, 200, 40, 5)
    assert result["started"], result
    standin = result["stand_in"]
    assert standin["launches"] == 200
    assert result["emitted"] == standin["kernels"] > 0
    assert result["dropped"].get("kernel_cupti_dropped", 0) == standin["dropped"]
    assert set(result["dropped"]) <= {"kernel_cupti_dropped"}
    assert result["other_records"] == standin["foreign"] > 0
    assert standin["held"] == 0  # the stand-in holds no buffer
    assert standin["completed"] == result["buffers_decoded"]  # each one decoded ...
    if callbacks == "shim":
        assert result["pool"]["buffers"] == 0  # ... and returned: the pool was freed
        assert result["pool"]["foreign"] == result["pool"]["bad_returns"] == 0
    else:
        assert standin["requests"] == standin["completed"]
        assert result["pool"]["queued"] == 0


def test_the_standin_deadlocks_python_callbacks(standin_path):
    """The harness reproduces the bug the native callbacks fix: Python callbacks (ctypes
    trampolines, the old probe's design) hang against a training thread holding the GIL."""
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, str(SCENARIO), str(standin_path), "-", "python", "5",
                        "40", "0"], capture_output=True, timeout=6, check=False)


# ---- records: mixed kinds, in-flight kernels, drops, names --------------------------------------

@pytest.mark.parametrize("callbacks", CALLBACKS)
def test_mixed_record_kinds_keep_every_kernel(callbacks, run, standin):
    probe, health, out = run.probe(callbacks, kernel_buffers=32)  # never short of buffers
    probe.step_begin(0)
    for _ in range(10):
        standin.launch(25, foreign=7, keep_gil=False)
    assert probe.drain()
    probe.shutdown()
    assert kernels_in(out) == standin.stats()["kernels"] == 250
    assert probe.stats.other_records == standin.stats()["foreign"] == 70
    assert probe.stats.walked_buffers > 0
    assert not health.dropped and health.probes["kernels"][0] == "on"


@pytest.mark.parametrize("callbacks", CALLBACKS)
def test_periodic_flush_never_cuts_running_kernels(callbacks, run, standin):
    """Kernels still running when the periodic flush comes stay in CUPTI until they end."""
    probe, health, out = run.probe(callbacks, kernel_flush_s=0.005)
    probe.step_begin(0)
    standin.launch(20, duration_ns=15_000_000, keep_gil=False)  # the device is 300 ms behind
    flushes = probe.stats.flushes
    assert wait_for(lambda: kernels_in(out) == 20, timeout=30)
    assert probe.stats.flushes > flushes  # flushed while the kernels ran
    probe.shutdown()
    assert "kernel_incomplete_record" not in health.dropped
    assert standin.stats()["incomplete"] == 0
    durations = np.concatenate([r["dur_ns"] for r in out])
    assert (durations == 15_000_000).all()


@pytest.mark.parametrize("callbacks", CALLBACKS)
def test_shutdown_forces_out_running_kernels_and_counts_them(callbacks, run, standin):
    probe, health, out = run.probe(callbacks, kernel_flush_s=10)
    probe.step_begin(0)
    standin.launch(10, duration_ns=2_000_000_000, keep_gil=False)  # still running at the end
    probe.shutdown()
    incomplete = standin.stats()["incomplete"]
    assert incomplete > 0
    assert health.dropped["kernel_incomplete_record"] == incomplete
    assert kernels_in(out) + incomplete == 10


def test_cuptis_dropped_records_are_counted(run, standin):
    """A pool with every buffer out refuses CUPTI's request; CUPTI drops and counts the
    records, and its count reaches argus_exporter_dropped_records_total."""
    release = threading.Event()
    out: list = []

    def slow_emit(record):
        release.wait(30)
        out.append(record)

    probe, health, _ = run.probe(emit=slow_emit, kernel_buffers=2)
    probe.step_begin(0)
    for _ in range(8):
        standin.launch(30, keep_gil=False)
    release.set()
    assert probe.drain()
    probe.shutdown()
    stats = standin.stats()
    assert stats["refused"] > 0 and stats["dropped"] > 0
    assert health.dropped["kernel_cupti_dropped"] == stats["dropped"]
    assert kernels_in(out) + stats["dropped"] == 240
    assert probe.stats.cupti_dropped == stats["dropped"]


def test_a_reused_name_pointer_gets_its_new_name(run, standin):
    probe, _, out = run.probe()
    probe.step_begin(0)
    standin.launch(4, keep_gil=False)
    assert probe.drain() and wait_for(lambda: kernels_in(out) == 4)
    standin.rename(0, "reloaded_module_kernel")
    standin.launch(4, keep_gil=False)
    probe.shutdown()
    first, later = set(out[0]["names"]), {n for r in out[1:] for n in r["names"]}
    assert "standin_gemm_kernel" in first and "reloaded_module_kernel" not in first
    assert "reloaded_module_kernel" in later and "standin_gemm_kernel" not in later


@pytest.mark.parametrize(("duty", "traced"), [(1, 8), (3, 3)])
def test_duty_cycle_traces_one_step_in_n(duty, traced, run, standin):
    probe, _, out = run.probe(kernel_duty=duty)
    for step in range(8):
        probe.step_begin(step)
        standin.launch(5, keep_gil=False)
        probe.step_end(step)
    probe.shutdown()
    assert kernels_in(out) == 5 * traced
    assert probe.stats.toggles == (1 if duty == 1 else 2 * traced)


def test_auto_duty_traces_a_launch_bound_job_less_often(run, standin):
    """Unset ARGUS_KERNEL_DUTY: 200 kernels in a 2 ms step would cost ~12% of every traced step,
    so after its first estimate the probe traces 1 step in 16 (under the 1% budget) and says
    so in its health line; the kernels of the traced steps are all there."""
    probe, health, out = run.probe(kernel_buffer_bytes=1 << 16)
    assert probe.duty == 1
    launched = 0
    for step in range(6 * 32):
        probe.step_begin(step)
        traced = probe._tracing
        standin.launch(200, keep_gil=False)
        launched += 200 if traced else 0
        assert probe.drain()
        probe.step_end(step, 0.002)
    assert probe.duty == 16
    line = re.search(r"1 step in 16 \(auto: ~(\d+) kernels a traced step cost ~([\d.]+)%",
                     health.probes["kernels"][1])
    assert line and 150 <= int(line[1]) <= 200, health.probes["kernels"]  # decoding lags
    assert 8 < float(line[2]) <= 12
    probe.shutdown()
    assert kernels_in(out) == launched < 200 * 6 * 32 // 2


# ---- time base ---------------------------------------------------------------------------------

def test_clock_offset_is_a_gauge_and_degrades_the_probe(run, standin):
    standin.set_timestamp_offset(5_000_000)  # CUPTI's clock 5 ms behind CLOCK_REALTIME
    probe, health, _ = run.probe(kernel_flush_s=0.01)
    state, reason = health.probes["kernels"]
    assert state == "degraded" and "ms off the host clock" in reason
    assert health.gauges[CLOCK_GAUGE][1] == pytest.approx(5e-3, abs=5e-4)
    families = {f.name: f for f in StepMetrics(IDENTITY, health, 4).collect()}
    assert families[CLOCK_GAUGE].samples[0].value == pytest.approx(5e-3, abs=5e-4)
    standin.set_timestamp_offset(0)
    probe.step_begin(0)  # the check runs at each flush
    assert wait_for(lambda: health.probes["kernels"][0] == "on")
    assert abs(health.gauges[CLOCK_GAUGE][1]) < 1e-3


# ---- other CUPTI clients, errors, forks ----------------------------------------------------------

@pytest.mark.parametrize("status", [26, 36, 39])
def test_busy_cupti_at_register(status, run, standin):
    standin.set_status(register=status)
    probe, health, _ = run.probe(start=False)
    assert probe.start() is False
    assert health.probes["kernels"][0] == "busy"
    probe.step_begin(0)
    probe.shutdown()


def test_busy_cupti_at_enable_goes_quiet(run, standin, caplog):
    standin.set_status(enable=39)
    probe, health, _ = run.probe(kernel_duty=2)
    with caplog.at_level(logging.INFO, logger="argus_exporters"):
        for step in range(6):
            probe.step_begin(step)
            probe.step_end(step)
        probe.shutdown()
    assert probe.stats.toggles == 1
    assert health.probes["kernels"][0] == "busy"
    assert len([r for r in caplog.records if "kernels probe busy" in r.getMessage()]) == 1


def test_torch_profiler_warmup_takes_cupti_over(run, standin):
    """torch.profiler registers kineto's callbacks when it prepares (warm-up), before it
    records: the probe stops there, takes its buffers home and never toggles again."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    probe, health, out = run.probe()
    probe.step_begin(0)
    standin.launch(5, keep_gil=False)
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=2, active=1)):
        assert health.probes["kernels"] == ("busy", PREPARE_REASON)
        standin.launch(5, keep_gil=False)  # kineto's now: not ours
        probe.step_begin(1)
    probe.step_begin(2)
    assert wait_for(lambda: kernels_in(out) == 5)
    probe.shutdown()
    assert standin.stats()["kernels"] == 5 and standin.stats()["held"] == 0
    assert probe._plumbing.stats()["buffers"] == 0  # every buffer came home: pool freed
    assert torch.autograd.profiler._prepare_profiler.__argus_wrapped__


def test_injected_cupti_tool_is_busy(run):
    probe, health, _ = run.probe(start=False)
    probe._env = {**probe._env, "CUDA_INJECTION64_PATH": "/opt/nsys/libToolsInjection64.so"}
    assert probe.start() is False
    assert health.probes["kernels"][0] == "busy"


class CountingLibrary(CuptiLibrary):
    """The stand-in, counting every CUPTI control call."""

    calls = 0

    def enable(self, kind):
        CountingLibrary.calls += 1
        super().enable(kind)

    def disable(self, kind):
        CountingLibrary.calls += 1
        super().disable(kind)

    def flush(self, forced):
        CountingLibrary.calls += 1
        super().flush(forced)


def test_a_forked_child_never_touches_cupti(run, standin):
    probe, _, _ = run.probe(backend=CountingLibrary(standin.lib, DTYPES), kernel_flush_s=10)
    probe.step_begin(0)
    pid = os.fork()
    if pid == 0:  # the child (its atexit handlers would run CUPTI calls in the old probe)
        before = CountingLibrary.calls
        probe.step_end(0)
        probe.pause()
        probe.step_begin(1)
        probe.shutdown()
        probe._atexit()
        os._exit(min(CountingLibrary.calls - before, 100))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ---- states --------------------------------------------------------------------------------------

def test_start_reports_off_skipped_and_bad_callbacks(run):
    probe, health, _ = run.probe(start=False, kernels=False)
    assert probe.start() is False and health.probes["kernels"][0] == "off"
    probe, health, _ = run.probe(start=False, extra={})
    probe._env = {}
    assert probe.start() is False and health.probes["kernels"][0] == "skipped"
    probe, health, _ = run.probe(start=False, kernel_callbacks="bogus")
    assert probe.start() is False
    assert health.probes["kernels"][0] == "unavailable"
    assert "bogus" in health.probes["kernels"][1]


def test_hooks_do_nothing_before_start_and_after_shutdown(run, standin):
    probe, _, out = run.probe(start=False)
    for step in range(3):
        probe.step_begin(step)
        probe.step_end(step)
    probe.pause()
    assert probe.drain(0.1)
    probe.shutdown()
    probe.shutdown()
    started, _, _ = run.probe()
    started.shutdown()
    started.step_begin(5)
    standin.launch(3, keep_gil=False)
    assert standin.stats()["kernels"] == 0 and out == []


# ---- torch's plumbing ----------------------------------------------------------------------------

def test_torch_plumbing_stops_with_its_own_sentinel_and_passes_others_on():
    pytest.importorskip("torch")
    first, second = TorchPlumbing.available(), TorchPlumbing.available()
    assert not isinstance(first, str), first
    second.stop()
    assert first.get_completed(1) is None  # not its sentinel: handed back to the queue
    assert second.get_completed(1) is STOPPED
    first.stop()
    assert first.get_completed(1) is STOPPED
    assert first.pending() == 0


def test_record_kind_constant_matches_the_standin():
    assert int(cupti_module.ActivityKind.RUNTIME) == RUNTIME_KIND


def test_kernel_callbacks_setting_is_checked():
    from argus_exporters.config import ConfigError

    assert Settings.from_env({}).kernel_callbacks == "auto"
    assert Settings.from_env({"ARGUS_KERNEL_CALLBACKS": " Shim "}).kernel_callbacks == "shim"
    with pytest.raises(ConfigError, match="ARGUS_KERNEL_CALLBACKS"):
        Settings.from_env({"ARGUS_KERNEL_CALLBACKS": "python"})


def test_without_a_compiler_or_prebuilt_shim_the_probe_is_off_and_says_why(run, tmp_path):
    """A training image with torch < 2.13 and no cc: the probe stays off (never Python
    callbacks), and argus_exporter_probe_up says what to do."""
    probe, health, _ = run.probe(start=False)
    probe._env = {"RANK": "0", "PATH": str(tmp_path), "ARGUS_CACHE_DIR": str(tmp_path / "c")}
    assert probe.start() is False
    state, reason = health.probes["kernels"]
    assert state == "unavailable"
    assert "no C compiler" in reason and "ARGUS_CUPTI_SHIM" in reason
