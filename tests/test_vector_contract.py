"""Contracts on both sides of the Vector agent, with the real exporters and the real processor.

- Exporters -> agent: the body the exporters' HTTP sink sends is what the agent's
  ``http_server`` source, as configured, decodes into events: the same records, one per line,
  with the token its auth check expects.
- Agent (and aggregator) -> processor: the exact requests Vector's ``http`` sink sends with the
  configs' settings (each event as JSON with sorted keys, newline-delimited without a trailing
  newline, gzip, ``application/x-ndjson``, bearer token) are accepted by ``argus processor``,
  started for real on a free port, record for record.
Vector itself cannot run here: its side is modelled in ``tests/vectorcheck/wire.py`` from its
source and documentation, and events cross its transforms through pyVRL.
"""

from __future__ import annotations

import gzip
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_port
from vectorcheck import config as vconfig
from vectorcheck import unit_tests, vrl, wire

from argus_core.simulate import SimConfig, retimed, simulate
from argus_core.topology import Topology
from argus_exporters import records as exporter_records
from argus_exporters.clock import HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import Tracer

vrl.require()

TOKEN = "agent-to-processor-token"
IDENTITY = RankIdentity("llm-70b", 3, 8, 3, "node-0", {"dp": 3, "tp": 0, "pp": 0, "ep": 0})


# -- exporters -> the agent's http_server source ------------------------------------------
class AgentIntake:
    """A loopback HTTP server answering as the agent's ``http_server`` source would."""

    def __init__(self, source: dict):
        self.events: list[dict] = []
        self.raw_lines: list[bytes] = []
        self.statuses: list[int] = []
        intake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    events = wire.decode_http_server(source, body, dict(self.headers),
                                                     self.path)
                except wire.HttpError as exc:
                    status = exc.status
                else:
                    status = 200
                    intake.events.extend(events)
                    intake.raw_lines.extend(gzip.decompress(body).splitlines())
                intake.statuses.append(status)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{source['path']}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_a_rank(url: str) -> Tracer:
    """A rank that trains five steps and also ships a kernel batch and a stack sample."""
    tracer = Tracer(Settings(enabled=True, sink=url, flush_s=0.05), IDENTITY, clock=HostClock())
    for _ in range(5):
        with tracer.phase("forward"):
            pass
        with tracer.phase("dp-allreduce"):
            pass
        tracer.step()
    tracer.emit(exporter_records.kernels_record(
        IDENTITY, ["gemm", "ncclAllReduce"], np.array([0, 1, 0], np.int32),
        np.array([7, 13, 7]), np.array([10, 20, 30]) + time.time_ns(), np.array([5, 6, 7])))
    tracer.emit(exporter_records.stack_record(IDENTITY, time.time_ns(), "MainThread",
                                              ["train.py:main:10", "train.py:step:42"]))
    tracer.shutdown(timeout=10)
    return tracer


def test_the_exporters_body_is_what_the_agents_source_decodes(monkeypatch):
    """Every record the exporters ship arrives as one event equal to the line they wrote,
    through gzip, newline framing, JSON decoding and the bearer-token check; each then passes
    the agent's record check."""
    monkeypatch.setenv("ARGUS_SINK_TOKEN", "exporter-token")
    agent = vconfig.load("agent.yaml", env={})
    intake = AgentIntake(agent["sources"]["argus_records"])
    try:
        tracer = run_a_rank(intake.url)
    finally:
        intake.close()
    assert set(intake.statuses) == {200}
    assert intake.events == [orjson.loads(line) for line in intake.raw_lines]
    kinds = [e["kind"] for e in intake.events]
    assert sorted(set(kinds)) == ["kernels", "rank", "stack", "step"] and len(kinds) == 8
    assert tracer.health.records_shipped == 8 and not tracer.health.dropped
    for event in intake.events:
        assert vrl.remap(agent["transforms"]["records_valid"], event).event == event


def test_a_wrong_token_is_refused_and_counted_not_retried(monkeypatch):
    """With the agent expecting another token, its source answers 401: the exporters drop
    the batches as sink errors (retrying would not help) and training goes on."""
    agent = vconfig.load("agent.yaml", env={})
    monkeypatch.setenv("ARGUS_SINK_TOKEN", "the-agents-token")
    intake = AgentIntake(agent["sources"]["argus_records"])
    try:
        # The rank was given another token (the agent reads its own from the same variable).
        tracer = Tracer(Settings(enabled=True, sink=intake.url, flush_s=0.05), IDENTITY,
                        clock=HostClock())
        tracer.shipper.sink.headers["Authorization"] = "Bearer a-stale-token"
        tracer.step()
        tracer.shutdown(timeout=10)
    finally:
        intake.close()
    assert intake.statuses and set(intake.statuses) == {401} and not intake.events
    assert tracer.health.dropped["sink_error"] >= 1 and not tracer.health.http_retries


# -- the agent's and aggregator's http sinks -> the processor -------------------------------
@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    """``argus processor`` on a free port with a bearer token; yields its base URL. Shared by
    the tests below (each uses its own job and reads counter differences)."""
    tmp_path = tmp_path_factory.mktemp("processor")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "argus_core.cli", "processor", "--listen", f"127.0.0.1:{port}",
         "--store", f"file://{tmp_path}/store", "--spool", str(tmp_path / "spool")],
        env={**os.environ, "ARGUS_PROCESSOR_TOKEN": TOKEN}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            # Ready, not just alive: intake answers 503 until the log is replayed.
            urllib.request.urlopen(f"{base}/readyz", timeout=1).close()
            break
        except OSError:  # not listening yet, or 503 (urllib's HTTPError is an OSError)
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(proc.communicate()[0].decode()) from None
            time.sleep(0.1)
    yield base
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def send(request: wire.Request) -> tuple[int, dict]:
    """POST one modelled Vector request; (status, JSON answer)."""
    http_request = urllib.request.Request(request.uri, data=request.body,
                                          headers=request.headers, method="POST")
    try:
        with urllib.request.urlopen(http_request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def processor_counters(base: str, job: str) -> dict[str, float]:
    """The processor's own counters from its /metrics (labels summed), and ``ranks``: how
    many ranks of ``job`` it knows the identity of."""
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {"ranks": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "argus_rank_info" and sample.labels.get("job") == job:
                values["ranks"] += 1
            elif sample.name.startswith("argus_processor_"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def grew(before: dict, after: dict, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def simulated_records(job: str) -> list[dict]:
    """A small simulated job's records (every kind) as the agent's source decodes them; the
    job ran a minute ago (the processor refuses records far from its clock)."""
    config = SimConfig(job=job, topology=Topology(dp=2, tp=2), steps=11, seed=7)
    lines = b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)
                     for _, r in retimed(simulate(config), time.time_ns() - 60 * 10**9))
    source = vconfig.load("agent.yaml", env={})["sources"]["argus_records"]
    return wire.decode_http_server(source, gzip.compress(lines), {"Content-Encoding": "gzip"},
                                   "/v1/records")


def routed(cfg: dict, insert_at: str, records: list[dict], outputs: dict[str, str]) -> dict:
    """Events per sink: ``outputs`` maps a transform output to the sink that consumes it."""
    out = unit_tests.Flow(cfg).push(insert_at, records)
    by_sink: dict[str, list[dict]] = {}
    for ref, sink in outputs.items():
        assert sink in cfg["sinks"] and ref in cfg["sinks"][sink]["inputs"], (ref, sink)
        by_sink.setdefault(sink, []).extend(out.get(ref, []))
    return by_sink


def test_the_agents_requests_are_accepted_by_the_processor(processor):
    """Every record of a simulated job, through the agent's check and routes, sent as the
    agent's two http sinks send it, is accepted by the processor: nothing rejected, every
    record and kernel counted, every rank's identity known."""
    port = processor.rsplit(":", 1)[1]
    cfg = vconfig.load("agent.yaml", "agent-processor.yaml", env={
        "ARGUS_PROCESSOR_ADDRESS": f"127.0.0.1:{port}", "ARGUS_PROCESSOR_TOKEN": TOKEN})
    records = simulated_records("contract-agent")
    before = processor_counters(processor, "contract-agent")
    by_sink = routed(cfg, "records_valid", records, {
        "records_by_kind.ranks": "processor_identity", "records_by_kind.steps":
        "processor_identity", "records_by_kind.kernels": "processor_traces",
        "records_by_kind.stacks": "processor_traces"})
    assert sum(map(len, by_sink.values())) == len(records)
    for sink, events in by_sink.items():
        (request,) = wire.encode_http_sink(cfg["sinks"][sink], events)
        assert request.headers["Content-Type"] == "application/x-ndjson"
        assert request.headers["Content-Encoding"] == "gzip"
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        assert not gzip.decompress(request.body).endswith(b"\n")  # Vector drops the last one
        status, answer = send(request)
        assert (status, answer["accepted"], answer["rejected"]) == (200, len(events), 0), answer
    after = processor_counters(processor, "contract-agent")
    assert grew(before, after, "argus_processor_records_total") == len(records)
    assert grew(before, after, "argus_processor_rejected_records_total") == 0
    kernels = sum(len(r["dur_ns"]) for r in records if r["kind"] == "kernels")
    assert grew(before, after, "argus_processor_kernel_events_total") == kernels
    assert after["ranks"] == 4


def test_without_the_token_the_processor_refuses_the_agent(processor):
    """An agent whose ARGUS_PROCESSOR_TOKEN does not match gets 401 for every request."""
    port = processor.rsplit(":", 1)[1]
    cfg = vconfig.load("agent.yaml", "agent-processor.yaml",
                       env={"ARGUS_PROCESSOR_ADDRESS": f"127.0.0.1:{port}"})
    (request,) = wire.encode_http_sink(cfg["sinks"]["processor_identity"],
                                       simulated_records("no-token")[:3])
    assert send(request)[0] == 401


def test_a_record_only_the_processor_can_refuse_costs_only_itself(processor):
    """A record whose shape is fine but whose values are not (a negative duration) passes the
    agent; the processor answers 400 naming its line and field and keeps the others. Vector
    does not retry a 400, so only that record is lost."""
    port = processor.rsplit(":", 1)[1]
    cfg = vconfig.load("agent.yaml", "agent-processor.yaml", env={
        "ARGUS_PROCESSOR_ADDRESS": f"127.0.0.1:{port}", "ARGUS_PROCESSOR_TOKEN": TOKEN})
    records = [r for r in simulated_records("one-bad") if r["kind"] == "kernels"][:5]
    records[2] = records[2] | {"dur_ns": [-5, *records[2]["dur_ns"][1:]]}
    events = routed(cfg, "records_valid", records,
                    {"records_by_kind.kernels": "processor_traces"})["processor_traces"]
    assert len(events) == 5  # the agent checks shape only
    (request,) = wire.encode_http_sink(cfg["sinks"]["processor_traces"], events)
    status, answer = send(request)
    assert (status, answer["accepted"], answer["rejected"]) == (400, 4, 1)
    assert answer["errors"] == ["line 3: dur_ns[0]: must be >= 0, got -5"]


def test_the_aggregator_delivers_each_hosts_records_to_its_processor(processor, monkeypatch):
    """Forward mode: the agent stamps its host, the aggregator routes by it and posts to that
    host's processor (URI template), without the stamp in the body; all records accepted."""
    host, port = processor.removeprefix("http://").rsplit(":", 1)
    monkeypatch.setenv("ARGUS_HOST", host)
    agent = vconfig.load("agent.yaml", "agent-forward.yaml", env={})
    aggregator = vconfig.load("aggregator.yaml", env={"ARGUS_PROCESSOR_PORT": port,
                                                      "ARGUS_PROCESSOR_TOKEN": TOKEN})
    records = simulated_records("contract-aggregator")
    before = processor_counters(processor, "contract-aggregator")
    forwarded = routed(agent, "records_valid", records, {
        "identity_for_aggregator": "aggregator_identity",
        "traces_for_aggregator": "aggregator_traces"})
    # The vector sink and source carry events as they are (Vector's native protocol).
    arriving = [e for events in forwarded.values() for e in events]
    assert len(arriving) == len(records) and all(e["_argus_host"] == host for e in arriving)
    by_sink = routed(aggregator, "records_routable", arriving, {
        "records_by_lane.identity": "processors_identity",
        "records_by_lane.traces": "processors_traces"})
    for sink, events in by_sink.items():
        (request,) = wire.encode_http_sink(aggregator["sinks"][sink], events)
        assert request.uri == f"http://{host}:{port}/v1/records"
        assert b"_argus_host" not in gzip.decompress(request.body)
        status, answer = send(request)
        assert (status, answer["accepted"]) == (200, len(events)), answer
    after = processor_counters(processor, "contract-aggregator")
    assert grew(before, after, "argus_processor_records_total") == len(records)
    assert after["ranks"] == 4


def test_the_aggregator_batches_per_host():
    """Records of two hosts become two requests, one to each host's processor."""
    aggregator = vconfig.load("aggregator.yaml", env={})
    events = [{"v": 1, "kind": "step", "job": "j", "rank": r, "_argus_host": h}
              for r, h in enumerate(["node-1", "node-2", "node-1"])]
    requests = wire.encode_http_sink(aggregator["sinks"]["processors_identity"], events)
    assert sorted(r.uri for r in requests) == ["http://node-1:9700/v1/records",
                                               "http://node-2:9700/v1/records"]
    lines = {r.uri: gzip.decompress(r.body).split(b"\n") for r in requests}
    assert len(lines["http://node-1:9700/v1/records"]) == 2


def test_the_source_refuses_a_body_it_cannot_decode_whole():
    """Vector's http_server answers 400 for the whole request when one line is not a JSON
    object (the exporters only write orjson lines, so only a foreign client can hit this)."""
    source = vconfig.load("agent.yaml", env={})["sources"]["argus_records"]
    good = b'{"v":1,"kind":"step"}\n'
    for bad in (b"{not json}\n", b"[1, 2]\n", b"42\n"):
        with pytest.raises(wire.HttpError) as refused:
            wire.decode_http_server(source, gzip.compress(good + bad),
                                    {"Content-Encoding": "gzip"}, "/v1/records")
        assert refused.value.status == 400
    assert len(wire.decode_http_server(source, good + b"\n\n" + good, {}, "/v1/records")) == 2
    with pytest.raises(wire.HttpError):
        wire.decode_http_server(source, good, {}, "/v1/other")


def test_the_agents_healthcheck_passes_against_the_processor(processor):
    """Vector's http sink healthcheck is a HEAD to ``healthcheck.uri`` that must answer 200
    (src/sinks/http/config.rs); the processor's /healthz does."""
    port = processor.rsplit(":", 1)[1]
    cfg = vconfig.load("agent.yaml", "agent-processor.yaml",
                       env={"ARGUS_PROCESSOR_ADDRESS": f"127.0.0.1:{port}"})
    for sink in ("processor_identity", "processor_traces"):
        check = cfg["sinks"][sink]["healthcheck"]
        assert check["enabled"]
        request = urllib.request.Request(check["uri"], method="HEAD")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
