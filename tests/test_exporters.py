"""The exporters' core on CPU: settings, identity, tracer, sinks, shipper, metrics, OTel, fork."""

from __future__ import annotations

import gzip
import http.server
import os
import socket
import threading
import time
import urllib.request
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_port

from argus_core.reader import load_traces
from argus_exporters import hooks
from argus_exporters.clock import HostClock
from argus_exporters.config import ConfigError, Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.metrics import serve
from argus_exporters.shipper import Shipper
from argus_exporters.sinks import create_sink
from argus_exporters.sinks.file import FileSink, safe_name
from argus_exporters.tracer import NoOpTracer, Tracer

IDENTITY = RankIdentity("job-a", 3, 8, 3, "node-0", {"dp": 3, "tp": 0, "pp": 0, "ep": 0})


def settings(tmp_path, **overrides) -> Settings:
    return Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05, **overrides)


def run_steps(tracer, steps: int = 5, sleep: float = 0.0) -> None:
    for _ in range(steps):
        with tracer.phase("forward"):
            time.sleep(sleep)
        with tracer.phase("dp-allreduce"):
            pass
        tracer.step()


# -- settings and identity ---------------------------------------------------------------
def test_everything_off_by_default():
    """Without ARGUS_ENABLED nothing is enabled and the defaults are the documented ones."""
    s = Settings.from_env({})
    assert not s.enabled and s.phases and not s.kernels and not s.stacks
    assert s.sink.startswith("file://") and s.metrics_port is None


@pytest.mark.parametrize("env, addr", [({}, "127.0.0.1"),
                                       ({"ARGUS_METRICS_ADDR": "0.0.0.0"}, "0.0.0.0")])
def test_metrics_port_binds_loopback_unless_told_otherwise(env, addr):
    """A rank's /metrics listens on loopback by default (like the processor); a remote
    scraper needs ARGUS_METRICS_ADDR. It used to bind 0.0.0.0 on every training host."""
    from argus_exporters.metrics import StepMetrics

    settings = Settings.from_env({"ARGUS_METRICS_PORT": str(free_port()), **env})
    health = Health()
    metrics = StepMetrics(RankIdentity.from_env({"RANK": "0", "WORLD_SIZE": "1"}), health, 10)
    server = serve(metrics, settings.metrics_port, settings.metrics_addr, health)
    try:
        assert server.server_address[0] == addr
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("env, name", [
    ({"ARGUS_ENABLED": "maybe"}, "ARGUS_ENABLED"),
    ({"ARGUS_QUEUE_RECORDS": "0"}, "ARGUS_QUEUE_RECORDS"),
    ({"ARGUS_FLUSH_S": "soon"}, "ARGUS_FLUSH_S"),
    ({"ARGUS_METRICS_PORT": "-1"}, "ARGUS_METRICS_PORT"),
    ({"ARGUS_METRICS_PORT": "70000"}, "ARGUS_METRICS_PORT"),
    ({"ARGUS_FLUSH_S": "nan"}, "ARGUS_FLUSH_S"),
    ({"ARGUS_FLUSH_S": "inf"}, "ARGUS_FLUSH_S"),
    ({"ARGUS_FLUSH_S": "1e308"}, "ARGUS_FLUSH_S"),
    ({"ARGUS_KERNEL_FLUSH_S": "inf"}, "ARGUS_KERNEL_FLUSH_S"),
    ({"ARGUS_HTTP_TIMEOUT_S": "nan"}, "ARGUS_HTTP_TIMEOUT_S"),
    ({"ARGUS_HTTP_TIMEOUT_S": "inf"}, "ARGUS_HTTP_TIMEOUT_S"),
    ({"ARGUS_HTTP_RETRY_S": "nan"}, "ARGUS_HTTP_RETRY_S"),
    ({"ARGUS_STACK_SPIKE_RATIO": "nan"}, "ARGUS_STACK_SPIKE_RATIO"),
    ({"ARGUS_QUEUE_RECORDS": "99999999999999999999"}, "ARGUS_QUEUE_RECORDS"),
    ({"ARGUS_WINDOW_STEPS": "99999999999999999999"}, "ARGUS_WINDOW_STEPS"),
    ({"ARGUS_KERNEL_DUTY": "0"}, "ARGUS_KERNEL_DUTY"),
    ({"ARGUS_KERNEL_DUTY": "sometimes"}, "ARGUS_KERNEL_DUTY"),
    ({"ARGUS_KERNEL_BUDGET": "0"}, "ARGUS_KERNEL_BUDGET"),
    ({"ARGUS_KERNEL_BUDGET": "5"}, "ARGUS_KERNEL_BUDGET"),
])
def test_bad_settings_name_the_variable(env, name):
    """A bad ARGUS_* value is refused with the variable's name: not a number, not finite, or
    beyond what the exporters can use (a port past 65535, a count no deque can hold, a period
    no timer can wait) is refused at start, never inside training."""
    with pytest.raises(ConfigError, match=name):
        Settings.from_env(env)


def test_kernel_duty_is_auto_unless_a_number_is_given():
    """ARGUS_KERNEL_DUTY: unset or ``auto`` lets the probe choose within ARGUS_KERNEL_BUDGET;
    a number fixes it."""
    assert Settings.from_env({}).kernel_duty == 0
    assert Settings.from_env({"ARGUS_KERNEL_DUTY": " Auto "}).kernel_duty == 0
    assert Settings.from_env({"ARGUS_KERNEL_DUTY": "4"}).kernel_duty == 4
    assert Settings.from_env({}).kernel_budget == 0.01
    assert Settings.from_env({"ARGUS_KERNEL_BUDGET": "0.005"}).kernel_budget == 0.005


def test_identity_from_torchrun_env():
    """RANK/LOCAL_RANK/WORLD_SIZE and ARGUS_COORDS/ARGUS_JOB make the rank's identity."""
    ident = RankIdentity.from_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16",
                                   "ARGUS_JOB": "llm", "ARGUS_COORDS": "dp=1,tp=1",
                                   "ARGUS_HOST": "n7"})
    assert (ident.rank, ident.local_rank, ident.world_size, ident.job) == (5, 1, 16, "llm")
    assert ident.coords == {"dp": 1, "tp": 1, "pp": 0, "ep": 0}
    assert ident.labels()["host"] == "n7"
    plain = RankIdentity.from_env({"RANK": "2", "WORLD_SIZE": "4"})
    assert plain.coords["dp"] == 2  # plain DDP: every rank is a DP replica


@pytest.mark.parametrize("env, message", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "outside WORLD_SIZE"),
    ({"RANK": "x"}, "RANK"),
    ({"RANK": "\u00b2", "WORLD_SIZE": "4"}, "RANK"),  # a digit to str.isdigit, not to int()
    ({"ARGUS_COORDS": "dp=\u00b2"}, "ARGUS_COORDS"),
    ({"ARGUS_COORDS": "dp=1,zz=2"}, "ARGUS_COORDS"),
    ({"ARGUS_COORDS": "dp=99999999999999999999"}, "ARGUS_COORDS"),
    ({"RANK": "99999999999999999999", "WORLD_SIZE": "999999999999999999999"}, "RANK"),
    ({"ARGUS_JOB": "j" * 5000}, "ARGUS_JOB"),
    ({"ARGUS_HOST": "h" * 5000}, "ARGUS_HOST"),
])
def test_bad_identity(env, message):
    """Inconsistent rank variables are refused with a message naming them, and so are values
    schema v1 bounds (ranks and coordinates below 2**31, names of at most 4096 characters):
    the processor would refuse every record of the rank."""
    with pytest.raises(ConfigError, match=message):
        RankIdentity.from_env(env)


# -- tracer -------------------------------------------------------------------------------
def test_noop_tracer_costs_nothing_and_does_nothing():
    """Off, the API is a no-op: hooks are not even registered."""
    tracer = NoOpTracer()
    with tracer.phase("x"):
        pass
    tracer.step()
    assert hooks.instrument(object(), object(), tracer) == []


def test_steps_are_spooled_and_readable(tmp_path):
    """Phases of each step add up into one step record that argus diagnose can read."""
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    run_steps(tracer, 4, sleep=0.01)
    tracer.shutdown()
    trace = load_traces([tmp_path]).traces["job-a"]
    assert len(trace.steps) == 4
    assert trace.ranks[3].coords == (3, 0, 0, 0)
    forward = trace.steps.phases[:, trace.steps.phase_names.index("forward")]
    assert (forward >= 0.01).all()
    assert (trace.steps.wall_s >= trace.steps.gpu_s * 0.99).all()
    assert (trace.steps.step == [0, 1, 2, 3]).all()


def test_repeated_phases_add_up(tmp_path):
    """The same phase entered several times in a step (per layer) sums into one value."""
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    for _ in range(3):
        with tracer.phase("mlp"):
            time.sleep(0.005)
    tracer.step()
    tracer.shutdown()
    steps = load_traces([tmp_path]).traces["job-a"].steps
    assert steps.phases[0, steps.phase_names.index("mlp")] >= 0.015


def test_late_phase_is_counted_not_misfiled(tmp_path):
    """A phase ending after its step closed is dropped and counted (late_phase)."""
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    token = tracer.begin_phase("dp-allreduce")
    tracer.step()
    tracer.end_phase(token)
    tracer.shutdown()
    assert tracer.health.dropped["late_phase"] == 1


def test_forked_child_emits_nothing(tmp_path):
    """A fork of the training process (a DataLoader worker) never traces."""
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    pid = os.fork()
    if pid == 0:  # child
        run_steps(tracer, 3)
        tracer.shutdown()
        os._exit(0)
    os.waitpid(pid, 0)
    run_steps(tracer, 2)
    tracer.shutdown()
    assert len(load_traces([tmp_path]).traces["job-a"].steps) == 2


def test_instrument_times_forward_backward_optimizer(tmp_path):
    """instrument(model, optimizer) yields forward, backward and optimizer phases per step."""
    torch = pytest.importorskip("torch")
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handles = hooks.instrument(model, optimizer, tracer)
    for _ in range(3):
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    for handle in handles:
        handle.remove()
    model(torch.randn(8, 16)).sum().backward()  # hooks removed: no phase, no step
    optimizer.step()
    tracer.shutdown()
    steps = load_traces([tmp_path]).traces["job-a"].steps
    assert len(steps) == 3
    assert set(steps.phase_names) == {"forward", "backward", "optimizer"}
    assert not any(v != v for v in steps.phases.ravel())  # every phase present in every step


# -- sinks and shipper ----------------------------------------------------------------------
def test_file_sink_rotates_and_caps_the_spool(tmp_path):
    """Past the per-file size a new file starts; past the spool cap the oldest go, counted."""
    health = Health()
    s = settings(tmp_path, file_max_bytes=2048, spool_max_bytes=8192)
    sink = FileSink(s, IDENTITY, health)
    line = b'{"v":1,"kind":"stack","job":"job-a","rank":3,"t_ns":1,"frames":[]}\n'
    for _ in range(600):
        assert sink.export([line])
    sink.shutdown()
    files = sorted((tmp_path / "job-a").iterdir())
    assert len(files) >= 3
    assert sum(f.stat().st_size for f in files) <= 8192 + 2048 + len(line)
    assert health.dropped["spool_full"] > 0
    assert load_traces([tmp_path]).records == 600 - health.dropped["spool_full"]


def test_job_names_are_safe_path_components():
    """A job name cannot escape the spool directory."""
    assert safe_name("../../etc") == "etc"
    assert "/" not in safe_name("a/b\\c") and safe_name("") == "job"


@pytest.mark.parametrize("url", ["file://", "file:spool", "file://host/dir"])
def test_file_sink_needs_an_absolute_directory(url):
    """``file://`` without an absolute path is refused, not a spool in whatever directory the
    training job happens to start in."""
    with pytest.raises(ConfigError, match="ARGUS_SINK"):
        create_sink(Settings(sink=url), IDENTITY, Health())


def test_unknown_sink_scheme(tmp_path):
    """An unknown ARGUS_SINK scheme is refused with the known ones listed."""
    with pytest.raises(ConfigError, match="unknown scheme 'ftp'"):
        create_sink(Settings(sink="ftp://x/y"), IDENTITY, Health())


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list] = []
    headers_seen: ClassVar[list] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(gzip.decompress(body))
        type(self).headers_seen.append(dict(self.headers))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_http_sink_posts_gzip_ndjson(tmp_path, monkeypatch):
    """Records arrive as gzip NDJSON POSTs with the content type Vector expects and a token."""
    monkeypatch.setenv("ARGUS_SINK_TOKEN", "s3cret")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/records"
        tracer = Tracer(Settings(enabled=True, sink=url, flush_s=0.05), IDENTITY,
                        clock=HostClock())
        run_steps(tracer, 5)
        tracer.shutdown()
    finally:
        server.shutdown()
    lines = b"".join(_Collector.bodies).splitlines()
    assert len(lines) == 6  # the rank record and five steps
    headers = _Collector.headers_seen[0]
    assert headers["Content-Type"] == "application/x-ndjson"
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Authorization"] == "Bearer s3cret"
    assert tracer.health.records_shipped == 6


def test_dead_endpoint_drops_and_counts_training_continues():
    """Nothing listening (and no retry budget: a restarting receiver is waited for, see
    test_vector_http_sink.py): every batch is dropped and counted; the loop still finishes."""
    url = f"http://127.0.0.1:{free_port()}/v1/records"
    tracer = Tracer(Settings(enabled=True, sink=url, flush_s=0.02, http_timeout_s=0.2,
                             http_retry_s=0.0), IDENTITY, clock=HostClock())
    run_steps(tracer, 20)
    tracer.shutdown(timeout=2)
    assert tracer.health.dropped["sink_error"] == 21
    assert tracer.health.export_failures >= 1 and tracer.health.records_shipped == 0


class _StuckSink:
    def __init__(self):
        self.release = threading.Event()
        self.got = 0

    def export(self, lines):
        self.release.wait(10)
        self.got += len(lines)
        return True

    def force_flush(self, timeout):
        return True

    def shutdown(self):
        self.release.set()


def test_full_queue_drops_oldest_and_never_blocks():
    """A stuck sink: submit keeps returning, the queue stays bounded, drops are counted."""
    health = Health()
    sink = _StuckSink()
    shipper = Shipper(sink, health, max_records=10, batch_records=5, flush_s=0.01)
    for i in range(200):
        shipper.submit(b"%d\n" % i)
    assert shipper.depth <= 10
    assert health.dropped["queue_full"] >= 180
    sink.release.set()
    assert shipper.force_flush(5)
    shipper.shutdown()
    assert sink.got + health.dropped["queue_full"] == 200


# -- metrics and OpenTelemetry ---------------------------------------------------------------
def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_endpoint_exposes_steps_windows_and_health(tmp_path):
    """/metrics carries step counters, rolling min/median/max, the clock that times the
    phases and the exporter's health."""
    tracer = Tracer(settings(tmp_path, window_steps=4), IDENTITY, clock=HostClock())
    run_steps(tracer, 6, sleep=0.002)
    tracer.force_flush()  # steps resolve in the background within RESOLVE_PERIOD_S
    tracer.health.drop("queue_full", 2)
    port = free_port()
    server = serve(tracer.metrics, port, "127.0.0.1", tracer.health)
    try:
        families = scrape(port)
    finally:
        server.shutdown()
        tracer.shutdown()
    steps = families["argus_steps"].samples[0]
    assert steps.value == 6
    assert steps.labels == {"job": "job-a", "rank": "3", "host": "node-0", "dp": "3", "tp": "0",
                            "pp": "0", "ep": "0"}
    stats = {s.labels["stat"]: s.value for s in families["argus_step_window_seconds"].samples}
    assert stats["min"] <= stats["median"] <= stats["max"]
    phases = {s.labels["phase"] for s in families["argus_phase_seconds"].samples}
    assert phases == {"forward", "dp-allreduce"}
    dropped = {s.labels["reason"]: s.value
               for s in families["argus_exporter_dropped_records"].samples}
    assert dropped["queue_full"] == 2
    assert families["argus_exporter_cpu_seconds"].samples[0].value > 0
    assert "argus_exporter_queue_depth" in families
    [clock] = families["argus_phase_clock_info"].samples  # the scorer's floor for its ranks
    assert clock.labels["clock"] == "host" and clock.labels["rank"] == "3" and clock.value == 1


def test_metrics_port_past_the_last_one_is_reported_not_raised(tmp_path):
    """ARGUS_METRICS_PORT + LOCAL_RANK beyond 65535 turns metrics off with the reason."""
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    assert serve(tracer.metrics, 65536, "127.0.0.1", tracer.health) is None
    assert tracer.health.probes["metrics"][0] == "unavailable"
    tracer.shutdown()


def test_metrics_port_in_use_is_reported_not_raised(tmp_path):
    """A taken port turns metrics off with the reason; training is unaffected."""
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert serve(tracer.metrics, busy.getsockname()[1], "127.0.0.1", tracer.health) is None
    assert tracer.health.probes["metrics"][0] == "unavailable"
    tracer.shutdown()


def test_phases_become_otel_spans(tmp_path):
    """With an SDK tracer provider set, each step is a span with one child per phase."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    run_steps(tracer, 2, sleep=0.003)
    tracer.shutdown()
    spans = exporter.get_finished_spans()
    steps = [s for s in spans if s.name == "argus.step"]
    phases = [s for s in spans if s.name == "argus.phase.forward"]
    assert len(steps) == 2 and len(phases) == 2
    assert phases[0].parent.span_id == steps[0].context.span_id
    assert phases[0].end_time - phases[0].start_time >= 3_000_000
    assert steps[0].attributes["argus.rank"] == 3


def test_probes_that_cannot_run_are_reported_and_training_goes_on(tmp_path, monkeypatch):
    """No GPU (CUPTI unavailable) and no py-spy: both probes report once, steps still flow,
    and /metrics shows each probe's state and reason."""
    import argus_exporters
    from argus_exporters import stacks

    monkeypatch.setattr(stacks, "find_py_spy", lambda *a, **k: None)
    s = settings(tmp_path, kernels=True, stacks=True)
    tracer = Tracer(s, IDENTITY, clock=HostClock())
    argus_exporters._start_probes(tracer, s, IDENTITY)
    assert tracer.probes == []
    run_steps(tracer, 3)
    tracer.force_flush()
    port = free_port()
    server = serve(tracer.metrics, port, "127.0.0.1", tracer.health)
    try:
        families = scrape(port)
    finally:
        server.shutdown()
        tracer.shutdown()
    up = {s.labels["probe"]: (s.labels["state"], s.value)
          for s in families["argus_exporter_probe_up"].samples}
    assert up["kernels"][1] == 0 and up["kernels"][0] in ("unavailable", "skipped")
    assert up["stacks"] == ("unavailable", 0)
    assert families["argus_steps"].samples[0].value == 3


def test_metrics_say_in_which_order_phases_happen():
    """One series per rank lists the phases in step order (the scorer needs it to tell who
    arrived last at a collective); a phase seen in some steps only sits at its mean place."""
    from argus_exporters.metrics import StepMetrics

    identity = RankIdentity("j", 0, 1, 0, "node-0", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
    metrics = StepMetrics(identity, Health(), 8)
    for step in range(4):
        phases = {"forward": 0.1, "backward": 0.2, "dp-allreduce": 0.05, "optimizer": 0.01}
        if step == 3:  # a custom phase once, between backward and the all-reduce
            phases = {"forward": 0.1, "backward": 0.2, "clip": 0.01, "dp-allreduce": 0.05,
                      "optimizer": 0.01}
        metrics.observe(0.4, 0.37, phases)
    [family] = [f for f in metrics.collect() if f.name == "argus_phase_order_info"]
    [sample] = family.samples
    assert sample.labels["order"] == "forward,backward,clip,dp-allreduce,optimizer"
    assert sample.labels["rank"] == "0" and sample.value == 1
    assert not [f for f in StepMetrics(identity, Health(), 8).collect()
                if f.name == "argus_phase_order_info"]  # no step yet, no order


def test_metrics_serve_the_cpu_wait_of_the_steps_that_carry_one():
    """The CPU wait's counter sums every step's; its window median is over the last N steps
    that carried one (a step without one, the first, is left out); no wait, no series."""
    from argus_exporters.metrics import StepMetrics

    identity = RankIdentity("j", 0, 1, 0, "node-0", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
    metrics = StepMetrics(identity, Health(), 3)
    for wait in (None, 0.004, 0.001, 0.002, 0.003):
        metrics.observe(0.4, 0.0, {"forward": 0.1}, wait)
    families = {f.name: f for f in metrics.collect()}
    [total] = families["argus_step_cpu_wait_seconds"].samples
    [median] = families["argus_step_cpu_wait_window_seconds"].samples
    assert total.value == pytest.approx(0.010)
    assert median.value == pytest.approx(0.002) and median.labels["stat"] == "median"
    assert median.labels["rank"] == "0"
    quiet = StepMetrics(identity, Health(), 3)
    quiet.observe(0.4, 0.0, {"forward": 0.1})
    assert not {"argus_step_cpu_wait_seconds", "argus_step_cpu_wait_window_seconds"} & {
        f.name for f in quiet.collect()}


_TRAIN_A_LITTLE = """
import argus_exporters as ax
ax.start()
for _ in range(5):
    with ax.phase("forward"):
        pass
    ax.step()
ax.shutdown(timeout=2)
print("trained")
"""


@pytest.mark.parametrize("name, value", [
    ("ARGUS_METRICS_PORT", "70000"),
    ("ARGUS_COORDS", "dp=99999999999999999999"),
    ("ARGUS_QUEUE_RECORDS", "99999999999999999999"),
    ("ARGUS_FLUSH_S", "inf"),
    ("ARGUS_HOST", "h" * 5000),
])
def test_an_absurd_value_never_stops_training(tmp_path, name, value):
    """A training process started with an absurd ARGUS_* value trains to the end, untraced,
    and its log names the variable (it used to die of an OverflowError or TypeError)."""
    import subprocess
    import sys

    env = {**os.environ, "ARGUS_ENABLED": "1", "ARGUS_SINK": f"file://{tmp_path}/spool",
           name: value}
    done = subprocess.run([sys.executable, "-c", _TRAIN_A_LITTLE], env=env, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr[-2000:]
    assert "bad configuration" in done.stderr and name in done.stderr


def test_an_unexpected_error_at_start_leaves_argus_off(monkeypatch, caplog):
    """Whatever goes wrong while the exporters start (not only a bad setting), start() logs it
    and returns the no-op tracer: the training script goes on untraced."""
    import argus_exporters

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(argus_exporters, "_started", False)
    monkeypatch.setattr(argus_exporters, "_tracer", NoOpTracer())
    monkeypatch.setattr(argus_exporters, "Tracer", broken)
    monkeypatch.setenv("ARGUS_ENABLED", "1")
    assert isinstance(argus_exporters.start(), NoOpTracer)
    assert "disk on fire" in caplog.text


def test_a_probe_is_told_every_step_and_shut_down_once(tmp_path):
    """The Probe protocol: a probe on ``tracer.probes`` gets each completed step's index and
    wall time on the training thread, and one shutdown at exit; a probe that raises at
    shutdown does not stop the others. The built-in probes are Probes."""
    from argus_exporters.kernels import KernelProbe
    from argus_exporters.probes import NoOpProbe, Probe
    from argus_exporters.stacks import StackProbe

    class Recording(NoOpProbe):
        def __init__(self):
            self.steps, self.shutdowns = [], 0

        def on_step(self, step, wall_s):
            self.steps.append((step, wall_s))

        def shutdown(self, timeout):
            self.shutdowns += 1

    class Broken(NoOpProbe):
        def shutdown(self, timeout):
            raise RuntimeError("a probe that fails at exit")

    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    first, second = Recording(), Recording()
    tracer.probes += [first, Broken(), second]
    run_steps(tracer, 3, sleep=0.002)
    tracer.shutdown()
    tracer.shutdown()
    assert [s for s, _ in first.steps] == [0, 1, 2] and all(w >= 0.002 for _, w in first.steps)
    assert (first.shutdowns, second.shutdowns) == (1, 1)
    assert all(isinstance(p, Probe) for p in tracer.probes)
    assert issubclass(KernelProbe, Probe) and issubclass(StackProbe, Probe)


# ---- how long the training thread waited for a CPU --------------------------------------------

HAS_SCHEDSTAT = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat")


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no run delay here")
def test_the_run_delay_counts_the_time_a_thread_waited_for_a_cpu():
    """Pinned to one core beside a busy process, the thread waits for its core: the wait it
    reads grows (until 50 ms have gathered; no fixed sleep)."""
    import subprocess
    import sys

    from argus_exporters.runqueue import RunDelay

    delay = RunDelay()
    assert delay.since_last() is None  # the first call only starts counting
    before = os.sched_getaffinity(0)  # pid 0: this thread
    core = min(before)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    waited = 0.0
    try:
        os.sched_setaffinity(hog.pid, {core})
        os.sched_setaffinity(0, {core})
        deadline = time.monotonic() + 60
        while waited < 0.05 and time.monotonic() < deadline:
            sum(range(20_000))  # stay runnable
            waited += delay.since_last()
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    assert waited >= 0.05
    other: list = []
    thread = threading.Thread(target=lambda: other.append(delay.since_last()))
    thread.start()
    thread.join()
    assert other == [None]  # another thread's count is not this one's: it starts again


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no run delay here")
def test_step_records_carry_the_training_threads_wait_for_a_cpu(tmp_path):
    tracer = Tracer(settings(tmp_path), IDENTITY, clock=HostClock())
    run_steps(tracer, 4, sleep=0.001)
    tracer.shutdown()
    trace = load_traces([tmp_path]).traces["job-a"]
    waits = trace.steps.cpu_wait_s
    assert len(waits) == 4 and (waits >= 0).all() and (waits < trace.steps.wall_s).all()


def test_dropping_warns_once_per_reason_at_the_first_record_dropped(caplog):
    """A reason counted with nothing dropped yet (its series shown at 0) says nothing; the
    first record dropped for it warns once, later ones are only counted."""
    health = Health()
    with caplog.at_level("WARNING", logger="argus_exporters"):
        health.drop("queue_full", 0)
        assert "dropping records" not in caplog.text and health.dropped["queue_full"] == 0
        health.drop("queue_full", 2)
        health.drop("queue_full")
        health.drop("sink_error")
    assert caplog.text.count("dropping records (queue_full)") == 1
    assert caplog.text.count("dropping records (sink_error)") == 1
    assert health.dropped == {"queue_full": 3, "sink_error": 1}
