"""Every VRL program of the Vector configs, compiled and run with pyVRL.

The agent's record check must pass every schema-v1 record the exporters and the simulator
write, unchanged, and route it by kind; reject malformed ones naming the same field as the
processor's schema; and never reject a record the schema accepts. The configs' own Vector
``tests:`` blocks run through the same VRL here, so they cannot rot.
"""

from __future__ import annotations

import gzip

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vectorcheck import config as vconfig
from vectorcheck import unit_tests, vrl, wire

from argus_core.schema import (
    MAX_DURATION_S,
    MAX_RANK,
    MAX_STEP,
    MAX_TEXT,
    MAX_TIMESTAMP_NS,
    SchemaError,
    parse_record,
)
from argus_core.simulate import SimConfig, simulate
from argus_core.topology import Topology
from argus_exporters import records as exporter_records
from argus_exporters.identity import RankIdentity

vrl.require()

MODES = {
    "default": ("agent.yaml", "agent-processor.yaml", "agent-remote-write.yaml"),
    "pull": ("agent.yaml", "agent-processor.yaml"),
    "forward": ("agent.yaml", "agent-forward.yaml"),
    "aggregator": ("aggregator.yaml",),
}
KINDS = ("rank", "step", "kernels", "stack")
ROUTE_OF = {"rank": "ranks", "step": "steps", "kernels": "kernels", "stack": "stacks"}
# Fields whose values the agent checks only at the top level; the processor checks their
# elements (and names them: phases.x, name[3]...).
ELEMENT_CHECKED = {"phases", "peers", "coords", "names", "name", "stream", "start_ns", "dur_ns",
                   "frames"}


@pytest.fixture(scope="module")
def agent():
    return vconfig.load(*MODES["default"], env={})


AGENT_SOURCE = vconfig.load("agent.yaml", env={})["sources"]["argus_records"]


def through_the_wire(records: list[dict], source: dict = AGENT_SOURCE) -> list[dict]:
    """Records as the agent's http_server source hands them on: encoded like the exporters
    (orjson NDJSON, gzip), decoded as the source is configured."""
    body = gzip.compress(b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY
                                               | orjson.OPT_APPEND_NEWLINE) for r in records))
    return wire.decode_http_server(source, body, {"Content-Encoding": "gzip"}, "/v1/records")


def check(agent: dict, record: dict) -> vrl.RemapOutcome:
    return vrl.remap(agent["transforms"]["records_valid"], record)


def all_programs() -> list:
    return [pytest.param(program, id=f"{mode}:{program.where}")
            for mode, files in MODES.items()
            for program in vrl.programs(vconfig.load(*files, env={}))]


@pytest.mark.parametrize("program", all_programs())
def test_every_vrl_program_compiles(program):
    """Remaps, route conditions, the http_server auth check, and the tests blocks' inputs and
    conditions all compile (a remap as Vector runs it, ending with the event)."""
    vrl.compiled(program.source + ("\n." if program.role in ("remap", "test_input") else ""))


def test_a_program_that_does_not_compile_is_reported_with_its_diagnostic():
    """pyVRL's compiler errors carry VRL's own diagnostic (code and position)."""
    with pytest.raises(vrl.VrlError, match="E103"):
        vrl.compiled(".record = parse_json(.message)")


def all_tests_blocks() -> list:
    return [pytest.param(mode, test["name"], id=f"{mode}:{test['name']}")
            for mode, files in MODES.items() for test in vconfig.load(*files, env={})["tests"]]


@pytest.mark.parametrize("mode, name", all_tests_blocks())
def test_the_configs_own_tests_blocks_pass(mode, name):
    """Each Vector-native ``tests:`` entry: its inputs through the config's VRL, its
    conditions on the outputs, its no_outputs_from, as ``vector test`` would run them."""
    cfg = vconfig.load(*MODES[mode], env={})
    test = next(t for t in cfg["tests"] if t["name"] == name)
    assert unit_tests.run(cfg, test) == []


def test_a_tests_block_with_a_wrong_expectation_fails(agent):
    """The runner is not a rubber stamp: a wrong condition or a wrong no_outputs_from fails."""
    test = agent["tests"][0]
    wrong = {**test, "outputs": [{"extract_from": "records_by_kind.kernels",
                                  "conditions": [{"type": "vrl",
                                                  "source": ".dur_ns == [1, 2, 3]"}]}]}
    assert unit_tests.run(agent, wrong)
    wrong = {**test, "no_outputs_from": ["records_by_kind.steps"]}
    assert any("expected no outputs" in e for e in unit_tests.run(agent, wrong))
    wrong = {**test, "outputs": [{"extract_from": "records_valid.dropped",
                                  "conditions": ["true"]}], "no_outputs_from": []}
    assert any("no events received" in e for e in unit_tests.run(agent, wrong))


@pytest.mark.parametrize("seed, topology", [
    (0, Topology(dp=4)), (1, Topology(dp=2, tp=2)), (2, Topology(dp=2, pp=2, tp=2)),
    (3, Topology(dp=2, tp=2, ep=2)), (4, Topology(dp=1, pp=4)), (5, Topology(dp=8))])
def test_simulated_jobs_pass_unchanged_and_go_to_their_kinds_route(agent, seed, topology):
    """Every record of simulated jobs (all four kinds, several topologies) passes the check
    untouched and comes out of exactly its kind's route."""
    config = SimConfig(job=f"sim-{seed}", topology=topology, steps=11, seed=seed)
    records = through_the_wire([r for _, r in simulate(config)])
    assert {r["kind"] for r in records} == set(KINDS)
    out = unit_tests.Flow(agent).push("records_valid", records)
    assert not out.get("records_valid.dropped") and not out.get("records_by_kind._unmatched")
    for kind in KINDS:
        sent = [r for r in records if r["kind"] == kind]
        assert out[f"records_by_kind.{ROUTE_OF[kind]}"] == sent


def test_records_written_by_the_exporters_pass(agent):
    """The exporters' own record builders (numpy columns included) produce records the agent
    accepts as they are."""
    ident = RankIdentity("llm-70b", 5, 16, 5, "node-1", {"dp": 1, "tp": 1, "pp": 0, "ep": 0})
    made = [exporter_records.rank_record(ident),
            exporter_records.step_record(ident, 17, 1_700_000_000_000_000_000, 0.41, 0.39,
                                         {"forward": 0.12, "dp-allreduce": 0.05}),
            exporter_records.kernels_record(ident, ["gemm", "nccl"], np.array([0, 1, 0]),
                                            np.array([7, 13, 7]), np.arange(3) * 1000 + 5,
                                            np.array([120, 90, 118])),
            exporter_records.stack_record(ident, 1_700_000_000_000_000_000, "MainThread",
                                          ["train.py:main:10"])]
    for record in through_the_wire(made):
        outcome = check(agent, record)
        assert outcome.event == record, outcome.message


def valid(kind: str) -> dict:
    """One valid record of each kind (DESIGN.md's examples)."""
    base = {"v": 1, "kind": kind, "job": "llm", "rank": 5}
    return base | {
        "rank": {"world_size": 16, "host": "node-1", "local_rank": 5,
                 "coords": {"dp": 1, "tp": 1, "pp": 0, "ep": 0}},
        "step": {"step": 17, "t_ns": 1_700_000_000_000_000_000, "wall_s": 0.41, "gpu_s": 0.39,
                 "phases": {"forward": 0.12, "backward": 0.2}},
        "kernels": {"names": ["gemm", "nccl"], "name": [0, 1, 0], "stream": [7, 13, 7],
                    "start_ns": [100, 250, 400], "dur_ns": [120, 90, 118]},
        "stack": {"t_ns": 1_700_000_000_000_000_000, "thread": "MainThread",
                  "frames": ["train.py:main:10", "train.py:step:42"]},
    }[kind]


@pytest.mark.parametrize("kind, change, field", [
    ("step", {"v": 2}, "v"), ("step", {"v": True}, "v"), ("rank", {"v": None}, "v"),
    ("step", {"kind": "trace"}, "kind"), ("step", {"kind": None}, "kind"),
    ("step", {"job": ""}, "job"), ("kernels", {"job": 7}, "job"),
    ("step", {"rank": -1}, "rank"), ("step", {"rank": 1.0}, "rank"),
    ("stack", {"rank": "5"}, "rank"),
    ("rank", {"world_size": 0}, "world_size"), ("rank", {"rank": 16}, "rank"),
    ("rank", {"host": ""}, "host"), ("rank", {"local_rank": -2}, "local_rank"),
    ("rank", {"coords": [1, 0]}, "coords"),
    ("step", {"step": None}, "step"), ("step", {"t_ns": -5}, "t_ns"),
    ("step", {"wall_s": "0.4"}, "wall_s"), ("step", {"wall_s": -0.1}, "wall_s"),
    ("step", {"wall_s": None}, "wall_s"), ("step", {"gpu_s": False}, "gpu_s"),
    ("step", {"phases": [0.1]}, "phases"), ("step", {"peers": [4]}, "peers"),
    ("step", {"peers": 0.02}, "peers"), ("step", {"cpu_wait_s": -0.001}, "cpu_wait_s"),
    ("step", {"cpu_wait_s": "0.01"}, "cpu_wait_s"),
    ("kernels", {"names": "gemm"}, "names"), ("kernels", {"dur_ns": None}, "dur_ns"),
    ("kernels", {"stream": {"0": 7}}, "stream"), ("kernels", {"dur_ns": [1, 2]}, "kernels"),
    ("kernels", {"name": []}, "kernels"),
    ("stack", {"frames": "main"}, "frames"), ("stack", {"thread": ""}, "thread"),
    ("stack", {"t_ns": 1.5}, "t_ns"),
])
def test_malformed_records_are_rejected_naming_the_field_the_schema_names(agent, kind, change,
                                                                          field):
    """A broken record leaves on records_valid.dropped with an abort message that names the
    same field as the processor's schema check."""
    record = {k: v for k, v in (valid(kind) | change).items() if v is not None}
    outcome = check(agent, record)
    assert outcome.event is None and outcome.dropped == record
    assert outcome.reason == "abort" and outcome.message.split(":")[0] == field
    with pytest.raises(SchemaError) as rejected:
        parse_record(record)
    assert rejected.value.field.split("[")[0].split(".")[0] == field


VALUES = st.sampled_from([None, True, False, 0, 1, -1, 2, 20, 1.0, 1.5, -0.5, 2**40, "", "x",
                          "1", [], [0], [1, 2], [0, 1, 0], ["a"], ["a", 1], [-1, 2, 3], {},
                          {"dp": 1}, {"a": 0.1}, {"a": "x"}, {"zz": 1}, "DELETE"])
# Values at and just past every bound schema v1 puts on a top-level field (and strings whose
# UTF-8 bytes outnumber their characters: the bounds count characters).
BOUNDS = [MAX_RANK, MAX_RANK + 1, MAX_RANK + 2, MAX_STEP, MAX_STEP + 1, MAX_TIMESTAMP_NS,
          MAX_TIMESTAMP_NS + 1, 2**63 - 1, 2**63, MAX_DURATION_S, MAX_DURATION_S + 0.5,
          int(MAX_DURATION_S) + 1, "x" * MAX_TEXT, "x" * (MAX_TEXT + 1), "é" * MAX_TEXT,
          "é" * (MAX_TEXT + 1)]
# top-level fields the valid records leave out
OPTIONAL = {"step": ["gpu_t_ns", "peers", "cpu_wait_s"]}


def assert_agent_agrees_with_the_schema(agent: dict, record: dict) -> None:
    """If the processor's schema accepts the record, the agent passes it unchanged; if the
    schema rejects it for a top-level reason, the agent rejects it too, naming the same
    field. Element-level problems (phases.x, name[3]...) are the processor's to name."""
    outcome = check(agent, record)
    try:
        parse_record(record)
    except SchemaError as exc:
        schema_field = exc.field.split("[")[0].split(".")[0]
        if schema_field not in ELEMENT_CHECKED:  # an element problem may hide another one
            assert outcome.event is None, (record, exc)
            assert outcome.message.split(":")[0] == schema_field, (record, outcome.message)
    else:
        assert outcome.event == record, (record, outcome.message)


@settings(max_examples=600, deadline=None, derandomize=False)
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_the_agent_never_rejects_what_the_schema_accepts(agent, kind, data):
    """Any one field of a valid record changed to any JSON value (or removed): the agent and
    the schema agree (:func:`assert_agent_agrees_with_the_schema`)."""
    record = valid(kind)
    field = data.draw(st.sampled_from([*sorted(record), *OPTIONAL.get(kind, ()), "world_size",
                                       "extra"]))
    value = data.draw(st.one_of(VALUES, st.sampled_from(BOUNDS)))
    if value == "DELETE":
        record.pop(field, None)
    else:
        record[field] = value
    assert_agent_agrees_with_the_schema(agent, through_the_wire([record])[0])


@pytest.mark.parametrize("kind", KINDS)
def test_the_agent_bounds_top_level_values_as_the_schema_does(agent, kind):
    """Every top-level field at and just past each of schema v1's bounds (ranks, steps,
    timestamps, one day, text length): the agent passes what the schema accepts and rejects,
    naming the field, what it refuses, so a record the processor would refuse with a 400
    never costs a request."""
    fields = [f for f in (*valid(kind), *OPTIONAL.get(kind, ()))
              if f not in ("v", "kind") and f not in ELEMENT_CHECKED]
    for field in fields:
        for value in BOUNDS:
            record = through_the_wire([valid(kind) | {field: value}])[0]
            assert_agent_agrees_with_the_schema(agent, record)


def test_rejected_records_are_counted_with_bounded_label_values(agent):
    """What reaches the counter is only the kind, and only schema v1's kinds or "invalid"."""
    broken = [valid("step") | {"wall_s": "slow"}, valid("kernels") | {"dur_ns": [1]},
              {"v": 1, "kind": "a" * 200, "job": "llm", "rank": 0}, {"hello": "world"}]
    out = unit_tests.Flow(agent).push("records_valid", broken)
    assert sorted(e["kind"] for e in out["records_rejected"]) == [
        "invalid", "invalid", "kernels", "step"]
    assert all(set(e) == {"kind"} for e in out["records_rejected"])


@pytest.mark.parametrize("token, header, allowed", [
    (None, None, True), (None, "Bearer anything", True), ("s3cret", "Bearer s3cret", True),
    ("s3cret", "Bearer wrong", False), ("s3cret", None, False), ("s3cret", "s3cret", False),
])
def test_the_intake_checks_the_exporters_bearer_token(agent, monkeypatch, token, header,
                                                      allowed):
    """With ARGUS_SINK_TOKEN set, only requests carrying it as a bearer token are taken;
    without it, the loopback intake takes every request."""
    if token is None:
        monkeypatch.delenv("ARGUS_SINK_TOKEN", raising=False)
    else:
        monkeypatch.setenv("ARGUS_SINK_TOKEN", token)
    source = agent["sources"]["argus_records"]["auth"]["source"]
    headers = {} if header is None else {"authorization": header}
    verdict, _ = vrl.condition(source, {"headers": headers, "address": "127.0.0.1",
                                        "path": "/v1/records"})
    assert verdict is allowed


@pytest.mark.parametrize("tags, host, instance", [
    (None, "node-9", None),
    ({"job": "llm", "instance": "127.0.0.1:9700"}, "node-9", "node-9:9700"),
    ({"host": "", "instance": "127.0.0.1:9598"}, "node-9", "node-9:9598"),
    ({"host": "node-7", "job": "llm", "instance": "127.0.0.1:9723"}, "node-7", "node-7:9723"),
    ({"host": "node-7", "instance": "10.0.0.2:9100"}, "node-7", "10.0.0.2:9100")])
def test_metrics_are_labelled_with_their_host_and_instance(agent, monkeypatch, tags, host,
                                                           instance):
    """The processor's and Vector's series get ARGUS_HOST; the exporters' host label stays;
    a scraped series' loopback instance becomes HOST:PORT; other labels are untouched."""
    monkeypatch.setenv("ARGUS_HOST", "node-9")
    metric = {"name": "argus_processor_records_total", "kind": "absolute", "type": "counter"}
    if tags is not None:
        metric["tags"] = dict(tags)
    out = vrl.remap(agent["transforms"]["metrics_labelled"], metric).event
    assert out["tags"]["host"] == host
    assert out["tags"].get("instance") == instance
    others = {k: v for k, v in (tags or {}).items() if k not in ("host", "instance")}
    assert {k: v for k, v in out["tags"].items() if k not in ("host", "instance")} == others


def test_forwarded_records_carry_this_host(monkeypatch):
    """In forward mode each record gets _argus_host from ARGUS_HOST, nothing else changes."""
    monkeypatch.setenv("ARGUS_HOST", "10.0.3.17")
    cfg = vconfig.load(*MODES["forward"], env={})
    for cid in ("identity_for_aggregator", "traces_for_aggregator"):
        record = valid("step")
        out = vrl.remap(cfg["transforms"][cid], record).event
        assert out == record | {"_argus_host": "10.0.3.17"}


@pytest.mark.parametrize("host, routable", [
    ("node-1", True), ("10.0.3.17", True), ("gpu-a100-007.cluster.local", True),
    ("", False), (None, False), ("evil/x", False), ("a b", False), ("host:9700", False),
    ("-leading", False), ("x" * 300, False), ("node-1\n", False)])
def test_the_aggregator_only_routes_records_with_a_plain_host(host, routable):
    """The host ends up in a URL: names and IPv4 addresses pass, anything else is rejected."""
    cfg = vconfig.load(*MODES["aggregator"], env={})
    record = valid("stack") | ({} if host is None else {"_argus_host": host})
    outcome = vrl.remap(cfg["transforms"]["records_routable"], record)
    assert (outcome.event is not None) is routable
    if not routable:
        assert outcome.message.startswith("_argus_host:")
