"""``argus simulate --live``: one /metrics endpoint per simulated host serving the exporters'
metrics, records posted to a real processor as the exporters' HTTP sink posts them, simulated
time mapped onto now, and the faults of the case in the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_port

from argus_core.cli import main
from argus_core.simulate.cases import CASES
from argus_core.simulate.live import LiveConfig, LiveJob
from argus_core.stack.processes import start, wait_ready
from argus_core.topology import Topology


def scrape(url: str) -> dict[tuple, float]:
    """(name, labels) -> value of one /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def processor(tmp_path):
    port = free_port()
    process = start("processor", [sys.executable, "-m", "argus_core.cli", "processor",
                                  "--listen", f"127.0.0.1:{port}", "--store",
                                  f"file://{tmp_path / 'store'}", "--spool",
                                  str(tmp_path / "spool"), "--window", "2", "--grace", "0.5"],
                    tmp_path / "logs")
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url + "/readyz")
    yield url
    process.stop()


def test_a_live_job_serves_hosts_and_posts_records(processor, tmp_path):
    # Two hosts of 8 ranks; rank 5 slow from step 15.
    config = CASES["compute-straggler"].config(steps=40, topology=Topology(dp=16))
    targets = tmp_path / "targets.json"
    job = LiveJob(LiveConfig(sim=config, processor=f"{processor}/v1/records",
                             targets_file=str(targets), step_seconds=0.05))
    runner = threading.Thread(target=job.run)
    before = time.time()
    runner.start()
    deadline = time.monotonic() + 30
    while not targets.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    groups = json.loads(targets.read_text())
    assert sorted(g["labels"]["argus_simulated_host"] for g in groups) == ["node-0", "node-1"]
    runner.join(60)
    assert job.steps_done == 40
    assert not targets.exists()  # a finished job leaves no target behind

    # What the processor received: identities of all 16 ranks, steps timed around now.
    metrics = scrape(f"{processor}/metrics")
    ranks = {dict(k[1])["rank"] for k in metrics if k[0] == "argus_rank_info"}
    assert ranks == {str(r) for r in range(16)}
    assert metrics[("argus_processor_records_total", ())] >= 16 * (1 + 40 * 2)
    assert metrics.get(("argus_processor_rejected_records_total", ()), 0) == 0
    deadline = time.monotonic() + 30  # windows close once idle, then upload
    while time.monotonic() < deadline and not list((tmp_path / "store").rglob("*.pftrace.gz")):
        time.sleep(0.2)
    keys = [p.name for p in (tmp_path / "store").rglob("*.pftrace.gz")]
    assert keys
    days = {time.strftime("%Y%m%dT", time.gmtime(t)) for t in (before, time.time())}
    assert all(k[:9] in days for k in keys), keys  # record times are now, not 2026-09-21


def test_the_hosts_endpoints_carry_the_exporters_labels_and_the_fault(tmp_path):
    config = CASES["compute-straggler"].config(steps=10 ** 6)
    job = LiveJob(LiveConfig(sim=config, step_seconds=0.02))
    runner = threading.Thread(target=job.run)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.steps_done < 60:
            time.sleep(0.1)
        (url,) = job.endpoints.values()  # dp=8: one host
        metrics = scrape(url)
    finally:
        job.stop()
        runner.join(30)
    mlp = {dict(k[1])["rank"]: v for k, v in metrics.items()
           if k[0] == "argus_phase_window_seconds" and dict(k[1])["phase"] == "mlp"
           and dict(k[1])["stat"] == "median"}
    assert len(mlp) == 8
    healthy = sorted(v for r, v in mlp.items() if r != "5")
    assert mlp["5"] > 10 * healthy[len(healthy) // 2]  # mlp x20 from step 15
    steps = {dict(k[1])["rank"]: v for k, v in metrics.items() if k[0] == "argus_steps_total"}
    labels = dict(next(k for k in metrics if k[0] == "argus_steps_total")[1])
    assert set(labels) == {"job", "rank", "host", "dp", "tp", "pp", "ep"}
    assert labels["job"] == "compute-straggler" and labels["host"] == "node-0"
    assert min(steps.values()) >= 60


def test_simulated_time_is_mapped_onto_now():
    job = LiveJob(LiveConfig(sim=CASES["healthy"].config(), step_seconds=0.5))
    job.start_clock()
    from argus_core.simulate.model import JOB_EPOCH_NS

    assert abs(job.real_ns(JOB_EPOCH_NS) - time.time_ns()) < 1e9
    one_step = job.real_ns(JOB_EPOCH_NS + int(job.speed * 0.5e9)) - job.real_ns(JOB_EPOCH_NS)
    assert one_step == pytest.approx(0.5e9, rel=1e-6)


def test_cli_live_announces_onsets_and_stops_on_sigterm(tmp_path):
    targets = tmp_path / "t.json"
    child = subprocess.Popen(
        [sys.executable, "-m", "argus_core.cli", "simulate", "--live", "--case", "jit-stall",
         "--fault-delay", "40", "--step-seconds", "0.02", "--targets", str(targets)],
        stdout=subprocess.PIPE, text=True)
    try:
        first = child.stdout.readline()
        onset = child.stdout.readline()
        assert "started at" in first
        assert "begins at step 52" in onset  # stalls at 12 and 27, 40 steps later
        deadline = time.monotonic() + 30
        while not targets.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert targets.exists()
    finally:
        child.terminate()
        out, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and "stopped after" in out
    assert not targets.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--live", "--out", "x"], "give --out DIR, or --live (not both)"),
    ([], "give --out DIR, or --live"),
    (["--live", "--step-seconds", "0"], "--step-seconds must be > 0"),
    (["--live", "--fault-delay", "-1"], "--fault-delay must be >= 0"),
    (["--live", "--processor", "ftp://x/v1/records"], "--processor must be an http(s):// URL"),
    (["--live", "--processor", "127.0.0.1:9700"], "--processor must be an http(s):// URL"),
])
def test_cli_refuses_bad_live_arguments(argv, message, capsys):
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_closing_a_live_job_toward_a_dead_processor_takes_one_flush_not_one_per_rank():
    """`argus stack down` after the processor crashed: the live job's ranks give the processor
    one shared flush timeout together (it used to be 2 s per rank, one after the other, so a
    16-rank job outlived `stack down`'s 20 s and was killed)."""
    config = CASES["healthy"].config(steps=3, topology=Topology(dp=16))
    job = LiveJob(LiveConfig(sim=config, processor=f"http://127.0.0.1:{free_port()}/v1/records",
                             step_seconds=0.05))
    job.close = lambda: None  # run the steps, close below
    job.run()
    assert len(job.ranks) == 16
    del job.close
    began = time.monotonic()
    job.close()
    assert time.monotonic() - began < 10


def test_the_stack_runs_the_moto_server_of_its_own_environment(tmp_path, monkeypatch):
    """`argus stack up` starts the moto_server installed beside the running Python (the one
    `pip install '.[dev]'` brought), not whichever one PATH finds first (a pyenv shim,
    another virtualenv's older moto)."""
    from pathlib import Path

    from argus_core.stack.stack import binary

    own = Path(sys.executable).parent / "moto_server"
    if not own.exists():
        pytest.skip("moto_server is not installed beside this Python")
    other = tmp_path / "moto_server"
    other.write_text("#!/bin/sh\nexit 1\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert binary("moto_server") == str(own)
