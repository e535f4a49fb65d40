"""Stack probe: real py-spy against a real child process, and fake py-spy binaries for the
failure paths (missing, not permitted, hanging, unusable pid)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest

from argus_core.schema import StackRecord, parse_record
from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.pyspy import find_py_spy, format_frame, parse_json_dump, parse_text_dump
from argus_exporters.stacks import StackProbe

IDENTITY = RankIdentity(job="j", rank=3, world_size=8, local_rank=3, host="h",
                        coords={"dp": 3, "tp": 0, "pp": 0, "ep": 0})

CHILD = textwrap.dedent("""\
    import sys
    import threading
    import time


    def sleeper_for_argus():
        while True:
            time.sleep(0.05)


    def busy_function_for_argus():
        sys.stdout.write("ready\\n")
        sys.stdout.flush()
        x = 0
        while True:
            x += 1


    threading.Thread(target=sleeper_for_argus, name="side-thread", daemon=True).start()
    busy_function_for_argus()
""")


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (bounded waits only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Collector:
    """Thread-safe ``emit`` target."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[dict] = []

    def __call__(self, record: dict) -> None:
        with self.lock:
            self.records.append(record)

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.records)

    def dumps(self) -> int:
        """Distinct samples (one t_ns per py-spy dump)."""
        return len({r["t_ns"] for r in self.snapshot()})


def settings(period: float = 0.2, ratio: float = 2.0) -> Settings:
    return Settings(enabled=True, stacks=True, stack_period_s=period, stack_spike_ratio=ratio)


def fake_py_spy(tmp_path: Path, body: str, name: str = "py-spy") -> str:
    """An executable shell script standing in for py-spy."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _real_py_spy() -> str | None:
    return find_py_spy()


@pytest.fixture
def child(tmp_path):
    """A Python child running ``busy_function_for_argus`` forever (killed afterwards)."""
    script = tmp_path / "argus_busy_child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def py_spy(child) -> str:
    """The real py-spy, skipped with the reason when it cannot attach here."""
    path = _real_py_spy()
    if path is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    run = subprocess.run([path, "dump", "--pid", str(child.pid)], capture_output=True,
                         timeout=20)
    if run.returncode != 0:
        pytest.skip("py-spy cannot attach in this environment: "
                    + run.stderr.decode(errors="replace").strip().splitlines()[0][:200])
    return path


def _busy_main(records: list[dict]) -> list[dict]:
    return [r for r in records if r["thread"] == "MainThread"
            and any("busy_function_for_argus" in f for f in r["frames"])]


# -------------------------------------------------------------------------- real py-spy


def test_periodic_samples_of_a_real_process(child, py_spy):
    emit, health = Collector(), Health()
    probe = StackProbe(settings(period=0.2), IDENTITY, emit, health, pid=child.pid,
                       py_spy=py_spy)
    try:
        assert probe.start() is True
        assert health.probes["stacks"][0] == "on"
        assert wait_for(lambda: emit.dumps() >= 2, timeout=5.0), "no periodic samples"
    finally:
        probe.shutdown(timeout=2.0)
    records = emit.snapshot()
    main = _busy_main(records)
    assert main, records
    for record in records:
        parsed = parse_record(orjson.loads(orjson.dumps(record)))
        assert isinstance(parsed, StackRecord)
        assert (parsed.job, parsed.rank) == ("j", 3)
    frames = main[0]["frames"]
    assert frames[-1].startswith("argus_busy_child.py:busy_function_for_argus:")
    assert frames[0].startswith("argus_busy_child.py:<module>:")
    assert all(len(f.split(":")) >= 3 and f.rsplit(":", 1)[1].isdigit() for f in frames)
    side = [r for r in records if r["thread"] == "side-thread"]
    assert side and "sleeper_for_argus" in side[0]["frames"][-1]
    assert health.cpu_seconds > 0  # py-spy's own CPU, measured from its rusage
    assert health.probes["stacks"][0] == "off"
    assert not probe._thread.is_alive()


def test_spike_triggers_a_burst(child, py_spy):
    emit, health = Collector(), Health()
    probe = StackProbe(settings(period=60.0, ratio=2.0), IDENTITY, emit, health, pid=child.pid,
                       py_spy=py_spy)
    probe.burst_gap_s = 0.05
    try:
        assert probe.start() is True
        assert wait_for(lambda: emit.dumps() >= 1, timeout=3.0)  # the start-up sample
        time.sleep(0.2)
        before = emit.dumps()
        assert before == 1  # the next periodic sample is a minute away
        for step in range(10):
            probe.on_step(step, 0.1)
        assert probe.bursts == 0
        t0 = time.perf_counter()
        probe.on_step(10, 0.5)  # 5x the median
        assert time.perf_counter() - t0 < 0.01  # the training thread never waits
        assert probe.bursts == 1
        assert wait_for(lambda: emit.dumps() >= before + probe.burst_samples, timeout=5.0)
        probe.on_step(11, 0.5)  # rate-limited: no second burst within the cooldown
        assert probe.bursts == 1
    finally:
        probe.shutdown(timeout=2.0)
    assert len(_busy_main(emit.snapshot())) >= 1 + probe.burst_samples


def test_own_process_is_sampled_without_the_probe_thread(py_spy):
    emit, health = Collector(), Health()
    probe = StackProbe(settings(period=0.2), IDENTITY, emit, health)  # pid: this process
    try:
        if not probe.start():
            pytest.skip(f"py-spy cannot attach to its parent here: {health.probes['stacks']}")
        assert wait_for(lambda: emit.dumps() >= 1, timeout=5.0)
    finally:
        probe.shutdown(timeout=2.0)
    records = emit.snapshot()
    assert all(r["thread"] != "argus-stacks" for r in records)
    main = [r for r in records if r["thread"] == "MainThread"]
    assert main and any("test_stacks.py:" in f for f in main[0]["frames"])


# -------------------------------------------------------------------------- unusable py-spy


def _assert_stays_off(probe: StackProbe, emit: Collector, health: Health) -> None:
    state, reason = health.probes["stacks"]
    assert state == "unavailable" and reason
    for step in range(20):
        probe.on_step(step, 10.0 if step == 19 else 0.1)
    t0 = time.perf_counter()
    probe.shutdown(timeout=1.0)
    probe.shutdown(timeout=1.0)
    assert time.perf_counter() - t0 < 1.0
    assert probe.bursts == 0 and emit.snapshot() == []
    assert health.probes["stacks"] == (state, reason)  # reported once, unchanged


def test_missing_py_spy(caplog):
    emit, health = Collector(), Health()
    probe = StackProbe(settings(), IDENTITY, emit, health, pid=os.getpid(),
                       py_spy="/nonexistent/py-spy")
    with caplog.at_level("WARNING", logger="argus_exporters"):
        assert probe.start() is False
        assert probe.start() is False
    assert "not found" in health.probes["stacks"][1]
    assert probe._thread is None
    assert sum("stacks probe unavailable" in m for m in caplog.messages) == 1
    _assert_stays_off(probe, emit, health)


@pytest.mark.parametrize("message", [
    "Permission Denied: Try running again with elevated permissions by going 'sudo !!'",
    "Error: Operation not permitted (os error 1)",
])
def test_not_permitted(tmp_path, message):
    emit, health = Collector(), Health()
    script = fake_py_spy(tmp_path, f"echo '{message}' >&2\nexit 1\n")
    probe = StackProbe(settings(), IDENTITY, emit, health, pid=os.getpid(), py_spy=script)
    t0 = time.perf_counter()
    assert probe.start() is False
    assert time.perf_counter() - t0 < 2.0
    reason = health.probes["stacks"][1]
    assert "not permitted" in reason and message.split(":")[0] in reason
    assert wait_for(lambda: not probe._thread.is_alive(), timeout=2.0)
    _assert_stays_off(probe, emit, health)


def test_pid_that_is_not_python(tmp_path):
    emit, health = Collector(), Health()
    script = fake_py_spy(
        tmp_path, "echo 'Error: Failed to find python version from target process' >&2\nexit 1\n")
    probe = StackProbe(settings(), IDENTITY, emit, health, pid=os.getpid(), py_spy=script)
    assert probe.start() is False
    assert "cannot sample" in health.probes["stacks"][1]
    _assert_stays_off(probe, emit, health)


def test_disabled_by_settings():
    health = Health()
    probe = StackProbe(Settings(stacks=False), IDENTITY, Collector(), health)
    assert probe.start() is False
    assert health.probes["stacks"][0] == "off"
    probe.on_step(1, 1.0)
    probe.shutdown()


def test_hanging_py_spy_times_out(tmp_path):
    emit, health = Collector(), Health()
    pids = tmp_path / "pids"
    # no exec: the sleep is a grandchild, so only killing the process group ends it
    script = fake_py_spy(tmp_path, f"echo $$ >> {pids}\nsleep 30\n")
    probe = StackProbe(settings(period=0.1), IDENTITY, emit, health, pid=os.getpid(),
                       py_spy=script, dump_timeout_s=0.3)
    t0 = time.perf_counter()
    assert probe.start() is True  # a slow dump says nothing about permission
    assert time.perf_counter() - t0 < 1.5
    assert wait_for(lambda: health.dropped["stack_timeout"] >= 1, timeout=3.0)
    t0 = time.perf_counter()
    probe.shutdown(timeout=1.0)
    assert time.perf_counter() - t0 < 1.5
    assert wait_for(lambda: not probe._thread.is_alive(), timeout=2.0)
    assert emit.snapshot() == []
    for pid in map(int, pids.read_text().split()):  # every fake py-spy was killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_shutdown_kills_a_dump_in_progress(tmp_path):
    emit, health = Collector(), Health()
    started = tmp_path / "started"
    script = fake_py_spy(tmp_path, f'case "$2" in --help) exit 1;; esac\ntouch {started}\n'
                                   "sleep 30\n")
    probe = StackProbe(settings(), IDENTITY, emit, health, pid=os.getpid(), py_spy=script,
                       dump_timeout_s=30.0)
    probe.start_wait_s = 0.3
    assert probe.start() is True
    assert wait_for(started.exists, timeout=3.0)
    t0 = time.perf_counter()
    probe.shutdown(timeout=1.0)
    assert time.perf_counter() - t0 < 1.5
    assert wait_for(lambda: not probe._thread.is_alive(), timeout=2.0)


def test_repeated_failures_turn_the_probe_off(tmp_path):
    emit, health = Collector(), Health()
    count = tmp_path / "count"
    dump = orjson.dumps([{"thread_name": "MainThread", "frames": [
        {"name": "f", "filename": "/x/train.py", "short_filename": "train.py", "line": 3}]}])
    (tmp_path / "dump.json").write_bytes(dump)
    # help fails, first dump succeeds, every later dump fails with a transient error
    script = fake_py_spy(tmp_path, textwrap.dedent(f"""\
        case "$2" in --help) exit 1;; esac
        echo x >> {count}
        if [ "$(wc -l < {count})" -le 1 ]; then cat {tmp_path / 'dump.json'}; exit 0; fi
        echo 'Error: failed to copy memory' >&2; exit 1
    """))
    probe = StackProbe(settings(period=0.1), IDENTITY, emit, health, pid=os.getpid(),
                       py_spy=script)
    probe.max_consecutive_failures = 3
    assert probe.start() is True
    assert wait_for(lambda: health.probes["stacks"][0] == "unavailable", timeout=5.0)
    assert "3 times in a row" in health.probes["stacks"][1]
    assert health.dropped["stack_error"] == 3
    assert [r["frames"] for r in emit.snapshot()] == [["train.py:f:3"]]
    probe.shutdown(timeout=1.0)


def test_emit_errors_are_counted_not_raised(tmp_path):
    health = Health()
    dump = orjson.dumps([{"thread_name": "MainThread", "frames": [
        {"name": "f", "filename": "/x/train.py", "short_filename": "train.py", "line": 3}]}])
    (tmp_path / "dump.json").write_bytes(dump)
    script = fake_py_spy(tmp_path, f"cat {tmp_path / 'dump.json'}\n")

    def emit(record: dict) -> None:
        raise RuntimeError("queue closed")

    probe = StackProbe(settings(period=0.1), IDENTITY, emit, health, pid=os.getpid(),
                       py_spy=script)
    assert probe.start() is True
    assert wait_for(lambda: health.dropped["stack_emit_error"] >= 2, timeout=3.0)
    probe.shutdown(timeout=1.0)
    assert probe._thread is not None and not probe._thread.is_alive()


# -------------------------------------------------------------------------- spikes, parsing


def test_on_step_spike_detection_and_cooldown(tmp_path):
    probe = StackProbe(settings(ratio=3.0), IDENTITY, Collector(), Health())
    probe._running = True  # judge spikes without a py-spy behind it
    probe.burst_cooldown_s = 0.2
    for step in range(probe.min_steps - 1):
        probe.on_step(step, 0.1)
    probe.on_step(99, 10.0)  # too few steps yet to judge
    assert probe.bursts == 0
    for step in range(40):
        probe.on_step(step, 0.1)
    probe.on_step(40, 0.29)  # below 3x the median
    probe.on_step(41, float("nan"))
    probe.on_step(42, -1.0)
    assert probe.bursts == 0
    probe.on_step(43, 0.31)
    assert probe.bursts == 1 and probe._burst_requested
    probe.on_step(44, 5.0)
    assert probe.bursts == 1  # cooldown
    time.sleep(0.25)
    probe.on_step(45, 5.0)
    assert probe.bursts == 2
    t0 = time.perf_counter()
    for step in range(10_000):
        probe.on_step(step, 0.1)
    assert (time.perf_counter() - t0) / 10_000 < 50e-6


def test_parse_json_dump():
    dump = [
        {"thread_name": "MainThread", "os_thread_id": 7, "frames": [
            {"name": "inner", "filename": "/opt/venv/lib/python3.12/site-packages/torch/nn/"
             "modules/module.py", "short_filename": None, "line": 1750},
            {"name": "main", "filename": "/work/train.py", "short_filename": "train.py",
             "line": 10}]},
        {"thread_name": None, "os_thread_id": 99, "frames": [
            {"name": "loop", "filename": "/a/b.py", "short_filename": "b.py", "line": 1}]},
        {"thread_name": "native-only", "frames": []},
    ]
    assert parse_json_dump(orjson.dumps(dump)) == [
        ("MainThread", ["train.py:main:10", "nn/modules/module.py:inner:1750"]),
        ("thread-99", ["b.py:loop:1"]),
    ]
    deep = [{"thread_name": "T", "frames": [{"name": f"f{i}", "filename": "x.py", "line": i}
                                            for i in range(1, 11)]}]
    assert parse_json_dump(orjson.dumps(deep), max_frames=3) == [
        ("T", ["x.py:f3:3", "x.py:f2:2", "x.py:f1:1"])]
    with pytest.raises(ValueError):
        parse_json_dump(b"Process 1: python\n")


def test_parse_text_dump():
    text = textwrap.dedent("""\
        Process 9063: /work/main/.venv/bin/python /tmp/busy.py
        Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

        Thread 9063 (active+gil): "MainThread"
            busy_function_for_argus (busy.py:5)
            <module> (busy.py:10)
        Thread 9065 (idle): "side-thread"
            sleeper (busy.py:8)
            Thread.run (threading.py:982)
        Thread 0x7F00 (idle)
            poll (loop.py:3)
        Thread 9070 (idle): "empty"
    """)
    assert parse_text_dump(text) == [
        ("MainThread", ["busy.py:<module>:10", "busy.py:busy_function_for_argus:5"]),
        ("side-thread", ["threading.py:Thread.run:982", "busy.py:sleeper:8"]),
        ("thread-0x7F00", ["loop.py:poll:3"]),
    ]


def test_format_frame():
    assert format_frame("/a/b/c/d/e.py", "fn", 3) == "c/d/e.py:fn:3"
    assert format_frame("e.py", "Cls.fn", None) == "e.py:Cls.fn:0"
    assert format_frame(None, None, 0) == "?:?:0"


def test_find_py_spy_in_this_venv():
    found = find_py_spy()
    if found is None:
        pytest.skip("py-spy is not installed")
    assert Path(found).name == "py-spy" and os.access(found, os.X_OK)
