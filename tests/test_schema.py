"""Schema v1 validation: ``argus_core.schema.parse_record`` (DESIGN.md "Trace record schema v1")."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argus_core.schema import (
    MAX_DURATION_NS,
    MAX_TIMESTAMP_NS,
    KernelBatch,
    PeerTime,
    RankRecord,
    SchemaError,
    StackRecord,
    StepRecord,
    parse_record,
)

# The examples of DESIGN.md, with the elided values (…) filled in.
RANK = {"v": 1, "kind": "rank", "job": "j", "rank": 5, "world_size": 16, "host": "node-1",
        "local_rank": 5, "coords": {"dp": 1, "tp": 1, "pp": 0, "ep": 0}}
STEP = {"v": 1, "kind": "step", "job": "j", "rank": 5, "step": 17,
        "t_ns": 1_790_000_000_000_000_000, "wall_s": 0.41, "gpu_s": 0.39,
        "phases": {"forward": 0.12, "backward": 0.2, "optimizer": 0.01, "dp-allreduce": 0.05}}
KERNELS = {"v": 1, "kind": "kernels", "job": "j", "rank": 5, "names": ["gemm", "ncclAllReduce"],
           "name": [0, 1, 0], "stream": [7, 13, 7],
           "start_ns": [1_000, 2_000, 3_000], "dur_ns": [500, 800, 450]}
STACK = {"v": 1, "kind": "stack", "job": "j", "rank": 5, "t_ns": 1_790_000_000_000_000_000,
         "thread": "MainThread", "frames": ["train.py:main:10", "train.py:step:42"]}
EXAMPLES = {"rank": RANK, "step": STEP, "kernels": KERNELS, "stack": STACK}


def with_(base: dict, **changes) -> dict:
    """A deep copy of ``base`` with top-level fields replaced (value ``...`` deletes the field)."""
    rec = copy.deepcopy(base)
    for key, value in changes.items():
        if value is ...:
            rec.pop(key, None)
        else:
            rec[key] = value
    return rec


def reject(rec) -> SchemaError:
    """Parse ``rec`` expecting a SchemaError and return it."""
    with pytest.raises(SchemaError) as info:
        parse_record(rec)
    return info.value


# --------------------------------------------------------------------------- valid records


def test_rank_record_from_design_parses_to_identity():
    """A DESIGN.md rank record yields its identity and coords in dp, tp, pp, ep order."""
    rec = parse_record(copy.deepcopy(RANK))
    assert rec == RankRecord(job="j", rank=5, world_size=16, host="node-1", local_rank=5,
                             coords=(1, 1, 0, 0))


def test_rank_record_absent_axes_default_to_zero():
    """Coords may omit axes (absent axes = 0) and host/local_rank are optional."""
    rec = parse_record({"v": 1, "kind": "rank", "job": "j", "rank": 3, "world_size": 8,
                        "coords": {"tp": 1}})
    assert rec.coords == (0, 1, 0, 0)
    assert rec.host == ""
    assert rec.local_rank == 0


def test_step_record_from_design_parses_times_and_phases():
    """A DESIGN.md step record keeps step number, timestamps, wall/gpu time and all phases."""
    rec = parse_record(copy.deepcopy(STEP))
    assert isinstance(rec, StepRecord)
    assert (rec.job, rec.rank, rec.step, rec.t_ns) == ("j", 5, 17, 1_790_000_000_000_000_000)
    assert rec.wall_s == pytest.approx(0.41)
    assert rec.gpu_s == pytest.approx(0.39)
    assert rec.phases == pytest.approx(STEP["phases"])
    assert list(rec.phases) == list(STEP["phases"])


def test_step_record_without_gpu_time_or_phases_is_accepted():
    """gpu_s and phases are optional: a host-only step still parses (gpu_s is NaN)."""
    rec = parse_record(with_(STEP, gpu_s=..., phases=...))
    assert math.isnan(rec.gpu_s)
    assert rec.phases == {}


def test_step_record_accepts_integer_seconds():
    """Seconds given as JSON integers (e.g. 1) are valid durations."""
    rec = parse_record(with_(STEP, wall_s=1, phases={"mlp": 0}))
    assert rec.wall_s == 1.0
    assert rec.phases == {"mlp": 0.0}


def test_step_record_keeps_how_long_its_thread_waited_for_a_cpu():
    """``cpu_wait_s`` is optional: the training thread's wait for a CPU during the step."""
    assert parse_record(with_(STEP, cpu_wait_s=0.0042)).cpu_wait_s == 0.0042
    assert parse_record(copy.deepcopy(STEP)).cpu_wait_s is None


PIPELINE_STEP = with_(STEP, phases={"pp-recv": 0.03, "forward": 0.1, "pp-send": 0.02},
                      peers={"pp-recv": {"4": {"s": 0.03, "n": 4, "min_s": 0.005}},
                             "pp-send": {"6": {"s": 0.02, "n": 4, "min_s": 0.004}}})


def test_step_record_keeps_each_point_to_point_phase_per_peer():
    """A pipeline stage's step names the ranks its sends and recvs exchanged data with: time,
    messages and the shortest message per peer."""
    rec = parse_record(copy.deepcopy(PIPELINE_STEP))
    assert rec.peers == {"pp-recv": {4: PeerTime(0.03, 4, 0.005)},
                         "pp-send": {6: PeerTime(0.02, 4, 0.004)}}
    assert parse_record(copy.deepcopy(STEP)).peers is None  # optional


def _peers(**by_phase) -> dict:
    return with_(PIPELINE_STEP, peers=by_phase)


def test_kernels_record_from_design_parses_to_numpy_columns():
    """A DESIGN.md kernels batch comes back as int columns equal to the input arrays."""
    rec = parse_record(copy.deepcopy(KERNELS))
    assert isinstance(rec, KernelBatch)
    assert rec.names == ["gemm", "ncclAllReduce"]
    assert rec.name.tolist() == [0, 1, 0]
    assert rec.stream.tolist() == [7, 13, 7]
    assert rec.start_ns.tolist() == [1_000, 2_000, 3_000]
    assert rec.dur_ns.tolist() == [500, 800, 450]
    for column in (rec.name, rec.stream, rec.start_ns, rec.dur_ns):
        assert np.issubdtype(column.dtype, np.integer)


def test_empty_kernels_batch_is_valid():
    """A batch with no kernels (all columns empty) is accepted, not an error."""
    rec = parse_record(with_(KERNELS, names=[], name=[], stream=[], start_ns=[], dur_ns=[]))
    assert len(rec.name) == 0
    assert len(rec.dur_ns) == 0


def test_kernels_integral_floats_are_accepted_as_integers():
    """Integral floats like 1000.0 (some JSON writers emit them) are read as integers."""
    rec = parse_record(with_(KERNELS, dur_ns=[500.0, 800.0, 450.0]))
    assert rec.dur_ns.tolist() == [500, 800, 450]
    assert np.issubdtype(rec.dur_ns.dtype, np.integer)


def test_stack_record_from_design_keeps_frames_in_order():
    """A DESIGN.md stack sample keeps thread and frames, outermost first."""
    rec = parse_record(copy.deepcopy(STACK))
    assert rec == StackRecord(job="j", rank=5, t_ns=1_790_000_000_000_000_000,
                              thread="MainThread",
                              frames=["train.py:main:10", "train.py:step:42"])


def test_stack_record_with_no_frames_is_valid():
    """An empty stack (no frames) is a valid sample."""
    assert parse_record(with_(STACK, frames=[])).frames == []


@pytest.mark.parametrize("value", [2**53 + 1, 2**53 + 3, 2**60 + 7, 1_790_000_000_123_456_789,
                                   MAX_TIMESTAMP_NS])
def test_start_ns_above_2_pow_53_is_kept_exactly(value):
    """Nanosecond timestamps beyond float64 precision (2**53) survive parsing bit-exactly."""
    rec = parse_record(with_(KERNELS, start_ns=[1, value, value - 2]))
    assert rec.start_ns.tolist() == [1, value, value - 2]
    assert rec.start_ns.dtype == np.int64


@pytest.mark.parametrize("durations", [
    pytest.param([500, 800, 450], id="integer-columns"),
    pytest.param([500.0, 800.0, 450.0], id="float-durations"),  # the value-by-value path
])
def test_start_ns_just_above_2_pow_53_is_kept_exactly(durations):
    """start_ns = 2**53 + 1 (the first integer float64 cannot hold) is not rounded to 2**53."""
    rec = parse_record(with_(KERNELS, start_ns=[1, 2**53 + 1, 2], dur_ns=durations))
    assert rec.start_ns.tolist() == [1, 2**53 + 1, 2]


# --------------------------------------------------------------------------- bad input

BAD_RECORDS = [
    # (id, record, expected field, words the message must contain)
    ("not-an-object-list", [1, 2], "record", ["JSON object", "list"]),
    ("not-an-object-string", "hello", "record", ["JSON object", "str"]),
    ("not-an-object-null", None, "record", ["JSON object"]),
    ("v-missing", with_(STEP, v=...), "v", ["version", "None"]),
    ("v-wrong", with_(STEP, v=2), "v", ["version", "2"]),
    ("v-true", with_(STEP, v=True), "v", ["version", "True"]),
    ("v-string", with_(STEP, v="1"), "v", ["version", "'1'"]),
    ("kind-missing", with_(STEP, kind=...), "kind", ["unknown kind", "None"]),
    ("kind-unknown", with_(STEP, kind="metrics"), "kind", ["unknown kind", "'metrics'", "step"]),
    ("job-missing", with_(STEP, job=...), "job", ["missing"]),
    ("job-empty", with_(STEP, job=""), "job", ["non-empty string"]),
    ("job-not-string", with_(STEP, job=7), "job", ["non-empty string", "7"]),
    ("rank-missing", with_(STEP, rank=...), "rank", ["missing"]),
    ("rank-negative", with_(STEP, rank=-1), "rank", [">= 0", "-1"]),
    ("rank-bool", with_(STEP, rank=True), "rank", ["integer", "bool"]),
    ("rank-float", with_(STEP, rank=1.0), "rank", ["integer", "float"]),
    ("rank-string", with_(STEP, rank="5"), "rank", ["integer", "str"]),
    ("rank-equals-world-size", with_(RANK, rank=16), "rank", ["16", "world_size"]),
    ("rank-above-world-size", with_(RANK, rank=20), "rank", ["20", "world_size 16"]),
    ("world-size-zero", with_(RANK, rank=0, world_size=0), "world_size", [">= 1"]),
    ("world-size-missing", with_(RANK, world_size=...), "world_size", ["missing"]),
    ("coords-unknown-axis", with_(RANK, coords={"dp": 1, "cp": 2}), "coords",
     ["unknown axis", "'cp'"]),
    ("coords-not-object", with_(RANK, coords=[1, 0, 0, 0]), "coords", ["object"]),
    ("coords-float", with_(RANK, coords={"dp": 1.5}), "coords.dp", ["integer", "1.5"]),
    ("coords-string", with_(RANK, coords={"tp": "1"}), "coords.tp", ["integer", "'1'"]),
    ("coords-negative", with_(RANK, coords={"pp": -1}), "coords.pp", [">= 0", "-1"]),
    ("step-wall-negative", with_(STEP, wall_s=-0.1), "wall_s", [">= 0", "-0.1"]),
    ("step-wall-nan", with_(STEP, wall_s=math.nan), "wall_s", ["finite", "nan"]),
    ("step-wall-inf", with_(STEP, wall_s=math.inf), "wall_s", ["finite", "inf"]),
    ("step-wall-string", with_(STEP, wall_s="0.41"), "wall_s", ["number of seconds", "'0.41'"]),
    ("step-wall-bool", with_(STEP, wall_s=True), "wall_s", ["number of seconds"]),
    ("step-wall-missing", with_(STEP, wall_s=...), "wall_s", ["number of seconds", "None"]),
    ("step-gpu-negative", with_(STEP, gpu_s=-1), "gpu_s", [">= 0"]),
    ("step-cpu-wait-negative", with_(STEP, cpu_wait_s=-0.002), "cpu_wait_s", [">= 0"]),
    ("step-cpu-wait-string", with_(STEP, cpu_wait_s="2ms"), "cpu_wait_s",
     ["number of seconds", "'2ms'"]),
    ("step-number-negative", with_(STEP, step=-3), "step", [">= 0", "-3"]),
    ("step-number-float", with_(STEP, step=1.5), "step", ["integer"]),
    ("step-t-ns-missing", with_(STEP, t_ns=...), "t_ns", ["missing"]),
    ("phases-not-object", with_(STEP, phases=[0.1, 0.2]), "phases", ["object"]),
    ("phases-not-object-number", with_(STEP, phases=0.3), "phases", ["object"]),
    ("phase-negative", with_(STEP, phases={"attention": 0.1, "mlp": -0.2}), "phases.mlp",
     [">= 0", "-0.2"]),
    ("phase-nan", with_(STEP, phases={"mlp": math.nan}), "phases.mlp", ["finite"]),
    ("phase-string", with_(STEP, phases={"mlp": "fast"}), "phases.mlp", ["'fast'"]),
    ("phase-empty-name", with_(STEP, phases={"": 0.1}), "phases", ["empty phase name"]),
    ("peers-not-object", with_(PIPELINE_STEP, peers=[4, 6]), "peers", ["object", "[4, 6]"]),
    ("peers-of-no-phase", _peers(**{"pp-p2p": {"4": {"s": 0.01, "n": 1, "min_s": 0.01}}}),
     "peers.pp-p2p", ["not a phase of this step"]),
    ("peers-phase-not-object", _peers(**{"pp-recv": 0.03}), "peers.pp-recv", ["object"]),
    ("peers-key-not-rank", _peers(**{"pp-recv": {"node-4": {"s": 0.01, "n": 1,
                                                            "min_s": 0.01}}}),
     "peers.pp-recv", ["'node-4'", "not a rank"]),
    ("peers-key-negative", _peers(**{"pp-recv": {"-4": {"s": 0.01, "n": 1, "min_s": 0.01}}}),
     "peers.pp-recv", ["'-4'", "not a rank"]),
    ("peers-self", _peers(**{"pp-recv": {"5": {"s": 0.01, "n": 1, "min_s": 0.01}}}),
     "peers.pp-recv.5", ["not its own peer"]),
    ("peers-value-a-number", _peers(**{"pp-recv": {"4": 0.03}}), "peers.pp-recv.4",
     ["{s, n, min_s}"]),
    ("peers-beyond-phase", _peers(**{"pp-recv": {"4": {"s": 0.5, "n": 4, "min_s": 0.01}}}),
     "peers.pp-recv.4.s", ["exceeds the phase's 0.03 s"]),
    ("peers-no-messages", _peers(**{"pp-recv": {"4": {"s": 0.03, "n": 0, "min_s": 0.01}}}),
     "peers.pp-recv.4.n", [">= 1"]),
    ("peers-count-float", _peers(**{"pp-recv": {"4": {"s": 0.03, "n": 2.5, "min_s": 0.01}}}),
     "peers.pp-recv.4.n", ["integer"]),
    ("peers-shortest-beyond-all", _peers(**{"pp-recv": {"4": {"s": 0.03, "n": 4,
                                                             "min_s": 0.04}}}),
     "peers.pp-recv.4.min_s", ["exceeds"]),
    ("peers-shortest-nan", _peers(**{"pp-recv": {"4": {"s": 0.03, "n": 4,
                                                      "min_s": math.nan}}}),
     "peers.pp-recv.4.min_s", ["finite"]),
    ("kernels-length-mismatch", with_(KERNELS, dur_ns=[1, 2]), "kernels",
     ["different lengths", "dur_ns=2", "name=3"]),
    ("kernels-length-mismatch-name", with_(KERNELS, name=[0]), "kernels",
     ["different lengths", "name=1", "stream=3"]),
    ("kernels-dur-negative", with_(KERNELS, dur_ns=[1, 2, -5]), "dur_ns[2]", [">= 0", "-5"]),
    ("kernels-dur-nan", with_(KERNELS, dur_ns=[1, math.nan, 3]), "dur_ns[1]",
     ["finite", "nan"]),
    ("kernels-dur-inf", with_(KERNELS, dur_ns=[math.inf, 2, 3]), "dur_ns[0]",
     ["finite", "inf"]),
    ("kernels-dur-neg-inf", with_(KERNELS, dur_ns=[1, 2, -math.inf]), "dur_ns[2]", ["finite"]),
    ("kernels-start-fractional", with_(KERNELS, start_ns=[1000, 1.5, 3000]), "start_ns[1]",
     ["integer", "1.5"]),
    ("kernels-stream-fractional", with_(KERNELS, stream=[7, 13, 7.25]), "stream[2]",
     ["integer", "7.25"]),
    ("kernels-start-text", with_(KERNELS, start_ns=[1, "soon", 3]), "start_ns[1]",
     ["integer", "'soon'"]),
    ("kernels-start-numeric-text", with_(KERNELS, dur_ns=[1, "5", 3]), "dur_ns[1]",
     ["integer", "'5'"]),
    ("kernels-dur-bool", with_(KERNELS, dur_ns=[True, 2, 3]), "dur_ns[0]",
     ["integer", "True"]),
    ("kernels-start-object", with_(KERNELS, start_ns=[1, 2, {"t": 3}]), "start_ns[2]",
     ["integer"]),
    ("kernels-start-null", with_(KERNELS, start_ns=[1, None, 3]), "start_ns[1]",
     ["integer", "None"]),
    ("kernels-start-nested", with_(KERNELS, start_ns=[[1], [2], [3]]), "start_ns[0]",
     ["integer", "[1]"]),
    ("kernels-text-among-large", with_(KERNELS, start_ns=[2**60, "1e3", 2**60 + 1]),
     "start_ns[1]", ["integer", "'1e3'"]),
    ("kernels-start-not-array", with_(KERNELS, start_ns=5), "start_ns", ["array", "int"]),
    ("kernels-start-missing", with_(KERNELS, start_ns=...), "start_ns", ["missing"]),
    ("kernels-start-too-big", with_(KERNELS, start_ns=[1, 2, 2**64]), "start_ns[2]",
     ["out of range"]),
    ("kernels-start-2-pow-63", with_(KERNELS, start_ns=[1, 2**63, 3]), "start_ns[1]",
     ["out of range"]),
    ("kernels-name-out-of-range", with_(KERNELS, name=[0, 2, 1]), "name[1]",
     ["index 2", "outside names", "len 2"]),
    ("kernels-name-negative", with_(KERNELS, name=[0, -1, 1]), "name[1]", [">= 0"]),
    ("kernels-names-not-strings", with_(KERNELS, names=["gemm", 3]), "names", ["strings"]),
    ("kernels-names-empty-string", with_(KERNELS, names=["gemm", ""]), "names", ["non-empty"]),
    ("kernels-names-not-list", with_(KERNELS, names="gemm"), "names", ["array"]),
    ("kernels-names-missing", with_(KERNELS, names=...), "names", ["array"]),
    ("stack-frames-not-list", with_(STACK, frames="train.py:main:10"), "frames",
     ["array of frame strings"]),
    ("stack-frames-not-strings", with_(STACK, frames=["train.py:main:10", 42]), "frames",
     ["array of frame strings"]),
    ("stack-frames-missing", with_(STACK, frames=...), "frames", ["array of frame strings"]),
    ("stack-t-ns-negative", with_(STACK, t_ns=-1), "t_ns", [">= 0"]),
    # Bounds: what a real job can produce (an absurd value used to break the window's file).
    ("step-wall-1e300", with_(STEP, wall_s=1e300), "wall_s", ["<= 86400", "1e+300"]),
    ("step-gpu-two-days", with_(STEP, gpu_s=172_800), "gpu_s", ["one day"]),
    ("step-phase-huge", with_(STEP, phases={"forward": 1e20}), "phases.forward", ["<= 86400"]),
    ("step-t-ns-near-2-pow-64", with_(STEP, t_ns=2**64 - 5), "t_ns", ["<= 4102444800"]),
    ("step-t-ns-year-2200", with_(STEP, t_ns=7_258_118_400 * 10**9), "t_ns", ["<="]),
    ("step-number-huge", with_(STEP, step=2**60), "step", ["<= 9007199254740992"]),
    ("stack-t-ns-beyond-2100", with_(STACK, t_ns=MAX_TIMESTAMP_NS + 1), "t_ns", ["<="]),
    ("rank-huge", with_(STEP, rank=2**40), "rank", ["<= 2147483647"]),
    ("world-size-huge", with_(RANK, world_size=2**40), "world_size", ["<="]),
    ("coords-huge", with_(RANK, coords={"dp": 2**35}), "coords.dp", ["<="]),
    ("kernels-start-beyond-2100", with_(KERNELS, start_ns=[1, MAX_TIMESTAMP_NS + 1, 3]),
     "start_ns[1]", ["out of range"]),
    ("kernels-dur-two-days", with_(KERNELS, dur_ns=[1, 2, 2 * MAX_DURATION_NS]), "dur_ns[2]",
     ["out of range"]),
    ("job-too-long", with_(STEP, job="j" * 5000), "job", ["longer than 4096"]),
    ("kernel-name-too-long", with_(KERNELS, names=["gemm", "x" * 70_000]), "names",
     ["longer than 65536"]),
    ("stack-too-deep", with_(STACK, frames=["f.py:g:1"] * 5000), "frames", ["more than 4096"]),
]


@pytest.mark.parametrize(("rec", "field", "words"),
                         [pytest.param(r, f, w, id=i) for i, r, f, w in BAD_RECORDS])
def test_bad_record_is_rejected_naming_the_field(rec, field, words):
    """Each schema violation raises SchemaError whose .field names the offender, with a reason."""
    error = reject(rec)
    assert error.field == field
    text = str(error)
    assert text.startswith(f"{field}: ")
    assert error.message and error.message in text
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


def test_schema_error_is_a_value_error():
    """Callers that catch ValueError also catch schema violations."""
    assert isinstance(reject(with_(STEP, v=2)), ValueError)


def test_rejection_does_not_mutate_input():
    """Validating a bad record leaves the caller's dict untouched."""
    rec = with_(KERNELS, dur_ns=[1, 2, -5])
    before = copy.deepcopy(rec)
    reject(rec)
    assert rec == before


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_every_kind_requires_job_and_rank(kind):
    """job and rank are mandatory on every kind of record."""
    assert reject(with_(EXAMPLES[kind], job=...)).field == "job"
    assert reject(with_(EXAMPLES[kind], rank=...)).field == "rank"


# --------------------------------------------------------------------------- property test


@st.composite
def kernel_batches(draw):
    """A valid kernels record with random, equal-length columns."""
    names = draw(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=5))
    n = draw(st.integers(0, 40))
    column = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=n, max_size=n)  # noqa: E731
    rec = {"v": 1, "kind": "kernels", "job": draw(st.text(min_size=1, max_size=8)),
           "rank": draw(st.integers(0, 2**31 - 1)), "names": names,
           "name": draw(column(0, len(names) - 1)), "stream": draw(column(0, 2**31)),
           "start_ns": draw(column(0, MAX_TIMESTAMP_NS)), "dur_ns": draw(column(0, 2**40))}
    # Some writers emit integral floats (500.0): that takes the column-by-column path.
    float_durations = draw(st.booleans())
    return rec, ([float(d) for d in rec["dur_ns"]] if float_durations else None)


@settings(max_examples=100, deadline=None)
@given(kernel_batches())
def test_kernels_batch_round_trips_columns_exactly(case):
    """Any valid kernels batch parses to columns equal, element for element, to its input."""
    rec, float_durations = case
    sent = copy.deepcopy(rec)
    if float_durations is not None:
        sent["dur_ns"] = float_durations
    batch = parse_record(sent)
    assert isinstance(batch, KernelBatch)
    assert (batch.job, batch.rank, batch.names) == (rec["job"], rec["rank"], rec["names"])
    for column in ("name", "stream", "start_ns", "dur_ns"):
        array = getattr(batch, column)
        assert np.issubdtype(array.dtype, np.integer)
        assert array.tolist() == rec[column], column


def test_the_exporters_check_identities_against_the_schemas_own_bounds():
    """argus_exporters imports nothing of argus_core (it goes into training images), so it
    keeps copies of schema v1's bounds and axes: they must be the schema's, or a rank the
    exporter accepts would be refused by the processor."""
    from argus_core import schema
    from argus_exporters import identity

    assert (identity.MAX_RANK, identity.MAX_TEXT, identity.AXES) == (
        schema.MAX_RANK, schema.MAX_TEXT, schema.AXES)
