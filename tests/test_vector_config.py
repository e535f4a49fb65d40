"""The Vector configs in ``vector/`` against Vector's JSON schema and as a topology.

Vector cannot be installed here: each way of running the agent (and the aggregator) is loaded
as Vector loads it (environment interpolation, files merged), validated against the vendored
schema, and its graph checked (inputs exist, every source reaches a sink, no output dangles,
every type is one the schema knows). Mistakes are injected to show the checks can fail.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from vectorcheck import config as vconfig
from vectorcheck import schema, topology

from argus_core.processor.service import ProcessorConfig

MODES = {
    "default": ("agent.yaml", "agent-processor.yaml", "agent-remote-write.yaml"),
    "pull": ("agent.yaml", "agent-processor.yaml"),
    "forward": ("agent.yaml", "agent-forward.yaml"),
    "aggregator": ("aggregator.yaml",),
}
ALL_FILES = sorted({name for files in MODES.values() for name in files})


@pytest.fixture(scope="module", params=sorted(MODES))
def mode(request):
    """(mode name, its config loaded with no environment: every variable's default)."""
    return request.param, vconfig.load(*MODES[request.param], env={})


def test_every_file_in_vector_dir_belongs_to_a_mode():
    """No config file is left out of the checks below."""
    shipped = sorted(p.name for p in vconfig.VECTOR_DIR.glob("*.yaml"))
    assert shipped == ALL_FILES


def test_vendored_schema_is_a_valid_draft_2019_09_schema():
    """The file in vector/schema/ is a schema a validator can trust (and knows the types we
    use)."""
    schema.check_schema_itself()
    types = schema.component_types()
    assert {"http_server", "prometheus_scrape", "internal_metrics", "vector"} <= types["sources"]
    assert {"remap", "route", "log_to_metric"} <= types["transforms"]
    assert {"http", "prometheus_remote_write", "prometheus_exporter", "vector"} <= types["sinks"]


def test_every_mode_validates_against_vectors_schema(mode):
    """Each way of running the configs is a valid Vector config, options and values alike."""
    name, cfg = mode
    assert schema.errors(cfg) == [], name


def test_every_mode_is_a_sound_topology(mode):
    """Inputs exist, every source reaches a sink, no output (route, dropped) dangles, every
    component type is one the schema knows, no cycle."""
    name, cfg = mode
    assert topology.problems(cfg) == [], name


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["sinks"]["processor_traces"].update(retries=3),
     "sinks.processor_traces: Unevaluated properties are not allowed ('retries'"),
    (lambda c: c["sinks"]["processor_traces"]["buffer"].update(when_full="drop_oldest"),
     "sinks.processor_traces.buffer"),
    (lambda c: c["sinks"]["metrics_remote_write"]["buffer"].update(max_size=1 << 20),
     "sinks.metrics_remote_write.buffer"),
    (lambda c: c["sources"]["argus_records"]["framing"].update(method="ndjson"),
     "sources.argus_records.framing"),
    (lambda c: c["sinks"]["processor_identity"].update(type="htttp"),
     "sinks.processor_identity"),
])
def test_schema_check_names_the_wrong_field(mutate, expected):
    """An unknown option, an enum value Vector lacks, a disk buffer under its minimum, a
    misspelt type: each is refused with the path of the field."""
    cfg = vconfig.load(*MODES["default"], env={})
    mutate(cfg)
    table, cid = expected.split(":")[0].split(".")[:2]
    found = schema.errors({table: {cid: cfg[table][cid]}})  # that component alone: faster
    assert any(e.startswith(expected) for e in found), found


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["transforms"]["records_rejected"]["inputs"].remove("records_valid.dropped"),
     "output 'records_valid.dropped' has no consumer"),
    (lambda c: c["transforms"]["records_rejected"]["inputs"].remove(
        "records_by_kind._unmatched"), "output 'records_by_kind._unmatched' has no consumer"),
    (lambda c: c["sinks"]["processor_traces"]["inputs"].append("records_by_kind.kernel"),
     "input 'records_by_kind.kernel' doesn't match any component output"),
    (lambda c: c["transforms"]["records_by_kind"].update(type="router"),
     "transforms.records_by_kind: unknown type 'router'"),
    (lambda c: c["sinks"].pop("metrics_exposed") and c["sinks"].pop("metrics_remote_write"),
     "output 'metrics_labelled' has no consumer"),
    (lambda c: c["transforms"]["records_valid"]["inputs"].append("records_by_kind.steps"),
     "cycle"),
])
def test_topology_check_finds_what_would_lose_or_stop_events(mutate, expected):
    """A dropped or unmatched output nobody counts, a misspelt input, an unknown type, a
    transform whose output goes nowhere, a cycle: each is reported."""
    cfg = vconfig.load(*MODES["default"], env={})
    mutate(cfg)
    found = topology.problems(cfg)
    assert any(expected in p for p in found), found


def test_a_source_that_reaches_no_sink_is_found():
    """A source whose events end nowhere is reported by name."""
    cfg = vconfig.load(*MODES["pull"], env={})
    del cfg["sinks"]["processor_identity"], cfg["sinks"]["processor_traces"]
    cfg["transforms"]["records_rejected"]["inputs"] = []
    assert "sources.argus_records: reaches no sink" in topology.problems(cfg)


@pytest.mark.parametrize("kind, sink", [
    ("ranks", "processor_identity"), ("steps", "processor_identity"),
    ("kernels", "processor_traces"), ("stacks", "processor_traces")])
def test_each_kind_reaches_its_processor_lane(kind, sink):
    """Identities and steps share one lane, kernel batches and stacks the other."""
    cfg = vconfig.load(*MODES["default"], env={})
    assert topology.path_exists(cfg, f"records_by_kind.{kind}", sink)
    other = {"processor_identity", "processor_traces"} - {sink}
    assert not topology.path_exists(cfg, f"records_by_kind.{kind}", other.pop())


@pytest.mark.parametrize("mode_name", sorted(MODES))
def test_rejected_records_are_counted_where_metrics_go(mode_name):
    """Every dropped or unmatched output feeds the rejected-record counter, and the counter
    reaches every metrics sink of the mode."""
    cfg = vconfig.load(*MODES[mode_name], env={})
    metric_sinks = [cid for cid, body in cfg["sinks"].items()
                    if body["type"] in ("prometheus_exporter", "prometheus_remote_write")
                    or (body["type"] == "vector" and "metrics" in cid)]
    dropped = [ref for ref in topology.output_ids(cfg)
               if ref.endswith((".dropped", "._unmatched"))]
    assert dropped and metric_sinks
    for ref in dropped:
        for sink in metric_sinks:
            assert topology.path_exists(cfg, ref, sink), (ref, sink)


def test_buffers_match_what_the_data_is_worth():
    """Metrics sinks buffer on disk and block when full (small, must not be lost); record
    sinks buffer in memory and drop the newest when full (a training host never stalls)."""
    for mode_name, files in MODES.items():
        cfg = vconfig.load(*files, env={})
        for cid, body in cfg["sinks"].items():
            buffer = body.get("buffer")
            if body["type"] == "prometheus_remote_write" or cid == "aggregator_metrics":
                assert buffer["type"] == "disk" and buffer["when_full"] == "block", cid
            elif body["type"] in ("http", "vector"):
                assert buffer["type"] == "memory", (mode_name, cid)
                assert buffer["when_full"] == "drop_newest", (mode_name, cid)


def test_processor_sinks_fit_the_processors_intake():
    """The record sinks post where the processor listens, in a format and size it takes."""
    processor = ProcessorConfig()
    for files in (MODES["default"], MODES["aggregator"]):
        cfg = vconfig.load(*files, env={})
        sinks = {cid: b for cid, b in cfg["sinks"].items() if b["type"] == "http"}
        assert len(sinks) == 2
        for cid, body in sinks.items():
            assert body["uri"].endswith(f":{processor.port}/v1/records"), cid
            assert body["compression"] == "gzip" and body["encoding"]["codec"] == "json"
            assert body["framing"]["method"] == "newline_delimited"
            assert body["batch"]["max_bytes"] * 4 <= processor.max_body_bytes, cid
            assert body["auth"]["strategy"] == "bearer"
            # Vector retries 503 with its own backoff (it ignores Retry-After): never sooner
            # than the processor asks, and for a bounded time.
            request = body["request"]
            assert 0 < request["retry_attempts"] <= 20
            assert request["retry_initial_backoff_secs"] >= processor.retry_after_s
            assert request["retry_jitter_mode"] == "None"


def test_scrape_covers_the_processor_and_eight_local_ranks():
    """The agent scrapes the processor's /metrics and one exporter port per local rank."""
    cfg = vconfig.load("agent.yaml", env={})
    endpoints = cfg["sources"]["argus_scrape"]["endpoints"]
    assert f"http://127.0.0.1:{ProcessorConfig().port}/metrics" in endpoints
    assert [e for e in endpoints if ":97" in e and ":9700" not in e] == [
        f"http://127.0.0.1:{9720 + local_rank}/metrics" for local_rank in range(8)]


def test_environment_overrides_reach_the_settings():
    """Each host's differences are environment variables: set ones replace the defaults,
    and a numeric-looking value becomes a number as in Vector."""
    env = {"ARGUS_PROCESSOR_ADDRESS": "10.1.2.3:9999", "ARGUS_PROCESSOR_TOKEN": "s3cret",
           "ARGUS_AGENT_LISTEN": "0.0.0.0:9810", "ARGUS_REMOTE_WRITE_URL":
           "http://mimir:8080/api/v1/push", "ARGUS_VECTOR_DATA_DIR": "/data/vector"}
    cfg = vconfig.load(*MODES["default"], env=env)
    assert cfg["sinks"]["processor_traces"]["uri"] == "http://10.1.2.3:9999/v1/records"
    assert cfg["sinks"]["processor_traces"]["auth"]["token"] == "s3cret"
    assert cfg["sources"]["argus_records"]["address"] == "0.0.0.0:9810"
    assert cfg["sinks"]["metrics_remote_write"]["endpoint"] == "http://mimir:8080/api/v1/push"
    assert cfg["data_dir"] == "/data/vector"
    aggregator = vconfig.load("aggregator.yaml", env={"ARGUS_PROCESSOR_PORT": "9800"})
    assert aggregator["sinks"]["processors_traces"]["uri"].endswith(":9800/v1/records")


@pytest.mark.parametrize("text, env, expected", [
    ("$FOO", {"FOO": "dogs"}, "dogs"),
    ("x${FOOBAR}y", {"FOOBAR": "cats"}, "xcatsy"),
    ("$$FOO", {"FOO": "dogs"}, "$FOO"),
    ("$ x", {}, "$ x"),
    ("${NOT:-dogs and cats}", {}, "dogs and cats"),
    ("${EMPTY:-cats}", {"EMPTY": ""}, "cats"),
    ("${EMPTY-cats}", {"EMPTY": ""}, ""),
    ("${NOT:-}", {}, ""),
    ("${FOO:?needed}", {"FOO": "dogs"}, "dogs"),
])
def test_interpolation_follows_vector(text, env, expected):
    """The cases of Vector's own interpolation test (src/config/loading/interpolation.rs)."""
    assert vconfig.interpolate(text, env) == expected


@pytest.mark.parametrize("text, env", [
    ("$NOT_SET", {}), ("${NOT:?must be set}", {}), ("${EMPTY:?must be set}", {"EMPTY": ""}),
    ("x$FOOBARy", {"FOOBAR": "cats"})])
def test_missing_variables_are_errors(text, env):
    """A variable without a default that is not set stops the load, as in Vector."""
    with pytest.raises(vconfig.ConfigError, match="not set"):
        vconfig.interpolate(text, env)


def test_every_variable_in_the_configs_has_a_default():
    """Loading every file with an empty environment succeeds: nothing is required to start."""
    for name in ALL_FILES:
        vconfig.load_file(vconfig.VECTOR_DIR / name, env={})


def test_merging_files_refuses_a_component_defined_twice():
    """Two files defining the same component id cannot be run together."""
    agent = vconfig.load_file(vconfig.VECTOR_DIR / "agent.yaml", env={})
    clash = {"sinks": {"metrics_exposed": copy.deepcopy(agent["sinks"]["metrics_exposed"])}}
    with pytest.raises(vconfig.ConfigError, match="duplicate sink id 'metrics_exposed'"):
        vconfig.merge([("agent.yaml", agent), ("extra.yaml", clash)])


def test_the_deployment_docs_snippets_run_the_default_mode():
    """docs/deploying.md's systemd unit and DaemonSet start Vector with exactly the default
    mode's files, and the DaemonSet is valid YAML; docs cannot drift from the configs."""
    page = (vconfig.REPO / "docs" / "deploying.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", page, re.S)
    (daemonset,) = [yaml.safe_load(body) for lang, body in blocks
                    if lang == "yaml" and "kind: DaemonSet" in body]
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}
    args = containers["vector"]["args"]
    assert [Path(a).name for a in args[1::2]] == list(MODES["default"])
    assert set(args[::2]) == {"--config"}
    (unit,) = [body for lang, body in blocks if lang == "ini" and "vector --config" in body]
    exec_start = unit[unit.index("ExecStart=/usr/bin/vector"):].split("\n\n")[0]
    files = re.findall(r"--config (\S+)", exec_start.replace("\\\n", " "))
    assert [Path(f).name for f in files] == list(MODES["default"])
