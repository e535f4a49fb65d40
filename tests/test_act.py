"""``argus act``: sustained hardware suspects become a drain plan an operator can trust.

The plan's rules on a clock the test drives (hold, flapping, budget, never a job's last node,
network units as tickets, no shell); then end to end: a real Alertmanager posts
ArgusSuspectUnit notifications to two ``argus act`` processes, one in a dry run (it plans,
runs nothing) and one with ``--execute`` and a stand-in command that records its arguments.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from am_support import Alertmanager
from promtools import binary
from support import free_port

from argus_core.act import plan
from argus_core.act.plan import ActConfig, Planner
from argus_core.stack.processes import start, wait_ready

T0 = 1_800_000_000.0


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def notification(*alerts: tuple[str, str, float, str]) -> dict:
    """An Alertmanager webhook payload of ArgusSuspectUnit alerts (kind, unit, startsAt,
    status)."""
    return {"version": "4", "status": "firing", "alerts": [
        {"status": status, "startsAt": _iso(started),
         "labels": {"alertname": "ArgusSuspectUnit", "job": "train", "unit_kind": kind,
                    "unit": unit, "cause": "communication", "hosts": unit.split("/")[0]}}
        for kind, unit, started, status in alerts]}


def planner(tmp_path: Path, **config) -> tuple[Planner, Clock]:
    clock = Clock()
    return Planner(ActConfig(hold_s=600, **config), tmp_path / "audit.ndjson",
                   clock=clock), clock


def states(p: Planner) -> dict[str, str]:
    return {step["unit"]: step["state"] for step in p.plan()}


def test_a_unit_is_planned_only_after_its_hold(tmp_path):
    p, clock = planner(tmp_path)
    p.notify(notification(("host", "node-3", T0, "firing")))
    clock.now = T0 + 599
    p.tick()
    assert states(p) == {"node-3": "holding"}
    clock.now = T0 + 600
    p.tick()
    (step,) = p.plan()
    assert step["state"] == "planned" and step["node"] == "node-3"
    assert step["argv"] == ["kubectl", "cordon", "node-3"]
    audit = [json.loads(line) for line in (tmp_path / "audit.ndjson").read_text().splitlines()]
    assert [a["state"] for a in audit] == ["holding", "planned"]


def test_a_flapping_suspect_never_drains_anything(tmp_path):
    """Fires for 5 minutes, resolves for 2, fires again, for two hours: the hold (10 min)
    starts over at every new firing."""
    p, clock = planner(tmp_path)
    for cycle in range(17):
        began = T0 + cycle * 420
        clock.now = began
        p.notify(notification(("nic", "node-3/mlx5_1", began, "firing")))
        for dt in range(0, 300, 30):
            clock.now = began + dt
            p.tick()
        clock.now = began + 300
        p.notify(notification(("nic", "node-3/mlx5_1", began, "resolved")))
        p.tick()
    assert states(p) == {"node-3/mlx5_1": "resolved"}
    assert p.drains == [] and "planned" not in p.decisions


def test_the_budget_holds_and_frees_with_its_window(tmp_path):
    p, clock = planner(tmp_path, budget=2, budget_window_s=3600)
    p.notify(notification(*[("host", f"node-{h}", T0, "firing") for h in (1, 2, 3)]))
    clock.now = T0 + 600
    p.tick()
    assert sorted(states(p).values()) == ["planned", "planned", "refused_budget"]
    clock.now = T0 + 600 + 3599
    p.tick()
    assert sorted(states(p).values()) == ["planned", "planned", "refused_budget"]
    clock.now = T0 + 600 + 3600
    p.tick()
    assert sorted(states(p).values()) == ["planned"] * 3


def test_the_last_node_of_a_job_is_never_drained(tmp_path):
    clock = Clock()
    p = Planner(ActConfig(hold_s=0, budget=10), None, lambda job: {"node-1", "node-2"},
                clock=clock)
    p.notify(notification(("host", "node-1", T0, "firing")))
    gpu = notification(("gpu", "GPU-2", T0, "firing"))
    gpu["alerts"][0]["labels"]["hosts"] = "node-2"  # the GPU's one host
    p.notify(gpu)
    assert states(p) == {"node-1": "planned", "GPU-2": "refused_last_node"}


def test_a_switch_gets_a_ticket_not_a_command(tmp_path):
    p, clock = planner(tmp_path)
    p.notify(notification(("leaf", "leaf-1", T0, "firing")))
    clock.now = T0 + 600
    p.tick()
    (step,) = p.plan()
    assert step["state"] == "ticket" and step["argv"] == [] and p.drains == []


def test_execute_runs_an_argument_vector_never_a_shell(tmp_path):
    calls = []

    def run(argv, **kwargs):
        calls.append((argv, kwargs))
        failed = any("node-9" in part for part in argv)
        return subprocess.CompletedProcess(argv, 1 if failed else 0, "", "denied")

    p = Planner(ActConfig(hold_s=0, execute=True, command="scontrol update NodeName={node} "
                                                          "State=DRAIN Reason={reason}"),
                None, run=run, clock=Clock())
    p.notify(notification(("host", "node-3; rm -rf /", T0, "firing"),
                          ("host", "node-9", T0, "firing")))
    assert states(p) == {"node-3; rm -rf /": "executed", "node-9": "failed"}
    argv, kwargs = calls[0]
    assert argv[:2] == ["scontrol", "update"] and argv[2] == "NodeName=node-3; rm -rf /"
    assert argv[4].startswith("Reason=argus: host") and kwargs["shell"] is False


def test_bad_input_is_refused_naming_what_is_wrong(tmp_path):
    p, _ = planner(tmp_path)
    with pytest.raises(ValueError, match="'alerts' list"):
        p.notify({"status": "firing"})
    with pytest.raises(ValueError, match="without the label 'unit'"):
        p.notify({"alerts": [{"labels": {"alertname": "ArgusSuspectUnit", "job": "j",
                                         "unit_kind": "host"}}]})
    with pytest.raises(ValueError, match="startsAt"):
        p.notify({"alerts": [{"status": "firing", "startsAt": "yesterday", "labels": {
            "alertname": "ArgusSuspectUnit", "job": "j", "unit_kind": "host", "unit": "h",
            "cause": "host"}}]})
    assert p.plan() == []
    with pytest.raises(ValueError, match="unknown placeholder 'host'"):
        ActConfig(command="kubectl cordon {host}")


def test_a_bad_alert_refuses_its_whole_notification(tmp_path):
    """A label longer than MAX_LABEL is refused by name, and the good alert beside it in the
    same notification is not taken either (all or nothing)."""
    p, clock = planner(tmp_path)
    good = notification(("nic", "node-1/mlx5_0", clock.now, "firing"))["alerts"][0]
    bad = {**good, "labels": {**good["labels"], "unit": "x" * (plan.MAX_LABEL + 1)}}
    with pytest.raises(ValueError, match="label 'unit' longer than 256"):
        p.notify({"alerts": [good, bad]})
    assert p.plan() == []


def test_the_plan_is_bounded_and_forgets_resolved_units_first(tmp_path, monkeypatch):
    """Past MAX_UNITS a new unit makes room: the longest-resolved unit goes, then the oldest
    unit not acted on; a unit acted on is never forgotten (its node stays drained)."""
    monkeypatch.setattr(plan, "MAX_UNITS", 3)
    p, clock = planner(tmp_path, budget=5)
    p.notify(notification(("nic", "node-1/a", clock.now, "firing")))
    clock.now += 600
    p.notify(notification(("nic", "node-2/a", clock.now - 600, "firing"),
                          ("nic", "node-3/a", clock.now, "firing")))
    assert states(p) == {"node-1/a": "planned", "node-2/a": "planned", "node-3/a": "holding"}
    p.notify(notification(("nic", "node-2/a", clock.now - 600, "resolved")))
    clock.now += 1
    p.notify(notification(("nic", "node-4/a", clock.now, "firing")))
    assert states(p) == {"node-1/a": "planned", "node-3/a": "holding", "node-4/a": "holding"}
    p.notify(notification(("nic", "node-5/a", clock.now, "firing")))
    assert states(p) == {"node-1/a": "planned", "node-4/a": "holding", "node-5/a": "holding"}


def _act(tmp_path: Path, name: str, *args: str):
    port = free_port()
    process = start(f"act-{name}", [sys.executable, "-m", "argus_core.cli", "act", "--listen",
                                    f"127.0.0.1:{port}", "--hold", "2s",
                                    "--audit", str(tmp_path / f"audit-{name}.ndjson"), *args],
                    tmp_path / "logs")
    wait_ready(process, f"http://127.0.0.1:{port}/", timeout=60)
    return process, f"http://127.0.0.1:{port}"


def _raw(url: str, request: bytes, wait_s: float = 30.0) -> bytes:
    """Send ``request`` as is and read the answer until the server closes."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_the_webhook_refuses_what_it_cannot_bound(tmp_path):
    """A webhook request without a byte count, with a negative one or with JSON nested past
    the parser's depth is refused (411, 400, 400); a client that sends half its body and
    stops is dropped, while other requests are answered meanwhile."""
    import socket

    process, url = _act(tmp_path, "bounds")
    try:
        head = b"POST /webhook HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        assert _raw(url, head + b"\r\n{}").startswith(b"HTTP/1.0 411")
        assert _raw(url, head + b"Content-Length: -1\r\n\r\n{}").startswith(b"HTTP/1.0 400")
        deep = b"[" * 100_000 + b"]" * 100_000
        answer = _raw(url, head + f"Content-Length: {len(deep)}\r\n\r\n".encode() + deep)
        assert answer.startswith(b"HTTP/1.0 400"), answer[:200]
        host, port = url.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)), timeout=60)
        stalled.sendall(head + b"Content-Length: 1000\r\n\r\n{\"alerts\": [")
        assert json.loads(_get(f"{url}/plan")) == []  # served beside the stalled client
        started = time.monotonic()
        assert stalled.recv(65536) == b""  # closed, within the socket's 60 s
        assert time.monotonic() - started < 30
        stalled.close()
        assert process.running
    finally:
        process.stop()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def test_alertmanager_to_a_dry_run_plan_and_an_executed_drain(tmp_path):
    binary("prometheus-alertmanager")
    recorder = tmp_path / "recorder.py"
    calls = tmp_path / "calls.ndjson"
    recorder.write_text("import json, sys\n"
                        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    dry, dry_url = _act(tmp_path, "dry")
    live, live_url = _act(tmp_path, "live", "--execute", "--command",
                          f"{sys.executable} {recorder} {{node}} {{reason}}")
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump({
        "route": {"receiver": "act", "group_by": ["alertname", "job", "unit"],
                  "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1m"},
        "receivers": [{"name": "act", "webhook_configs": [
            {"url": f"{dry_url}/webhook"}, {"url": f"{live_url}/webhook"}]}]}))
    (tmp_path / "am").mkdir()
    am = Alertmanager(tmp_path / "am", config, keep_webhooks=True)
    try:
        started = datetime.now(UTC) - timedelta(seconds=30)
        am.post([{"alertname": "ArgusSuspectUnit", "job": "train", "unit_kind": "nic",
                  "unit": "node-3/mlx5_1", "cause": "communication", "hosts": "node-3",
                  "severity": "warning", "level": "L3"},
                 {"alertname": "ArgusSuspectUnit", "job": "train", "unit_kind": "leaf",
                  "unit": "leaf-1", "cause": "communication", "hosts": "node-6, node-7",
                  "severity": "warning", "level": "L3"}], started=started)
        deadline = time.monotonic() + 60
        while not (calls.exists() and calls.read_text().strip()):
            assert time.monotonic() < deadline, "the executing act ran nothing"
            time.sleep(0.5)
        plan = {s["unit"]: s for s in json.loads(_get(f"{dry_url}/plan"))}
        while {s["state"] for s in plan.values()} != {"planned", "ticket"}:
            assert time.monotonic() < deadline, f"dry-run plan {plan}"
            time.sleep(0.5)
            plan = {s["unit"]: s for s in json.loads(_get(f"{dry_url}/plan"))}
        assert plan["node-3/mlx5_1"]["argv"] == ["kubectl", "cordon", "node-3"]
        assert plan["leaf-1"]["state"] == "ticket"
        (argv,) = [json.loads(line) for line in calls.read_text().splitlines()]
        assert argv[0] == "node-3" and argv[1].startswith("argus: nic node-3/mlx5_1")
        metrics = _get(f"{live_url}/metrics")
        assert 'state="executed"' in metrics and 'node="node-3"' in metrics
        assert "argus_act_execute 1.0" in metrics
        assert "argus_act_execute 0.0" in _get(f"{dry_url}/metrics")
        audit = (tmp_path / "audit-dry.ndjson").read_text()
        assert '"state": "planned"' in audit and '"state": "ticket"' in audit
    finally:
        am.stop()
        dry.stop()
        live.stop()
