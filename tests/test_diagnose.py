"""diagnose() on partial telemetry: only kernels, only steps, degenerate phases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from argus_core.detect.diagnose import diagnose
from argus_core.simulate import CASES
from argus_core.trace import KernelTable, StepTable, Trace


def without(trace: Trace, *, steps: bool = False, kernels: bool = False) -> Trace:
    empty = np.zeros(0, dtype=np.int64)
    step_table = StepTable(empty, empty, empty, empty.astype(float), empty.astype(float), [],
                           np.zeros((0, 0))) if steps else trace.steps
    kernel_table = KernelTable(empty, empty.astype(np.int32), empty, empty, empty,
                               trace.kernels.names) if kernels else trace.kernels
    return Trace(trace.job, trace.ranks, step_table, kernel_table, trace.stacks)


def test_kernels_only_still_finds_the_slow_rank(trace_of):
    """With the kernel probe alone (no step records), L3 still names rank 5's kernels."""
    trace = without(trace_of(CASES["compute-straggler"].config(seed=0)), steps=True)
    d = diagnose(trace)
    doc = d.to_json()
    assert doc["l1"] == {"spikes": [], "regressions": []} and doc["l2"]["stragglers"] == []
    assert {s["rank"] for s in doc["l3"]["stragglers"]} == {5}
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(5, "compute")]
    assert any("no step records" in w for w in d.warnings)


def test_steps_only_still_finds_the_slow_rank(trace_of):
    """With the phase probe alone (no kernels), L1 and L2 carry the diagnosis."""
    trace = without(trace_of(CASES["compute-straggler"].config(seed=0)), kernels=True)
    doc = diagnose(trace).to_json()
    assert doc["l3"]["stragglers"] == []
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(5, "compute")]


def test_zero_time_phase_gives_valid_json(trace_of):
    """A phase that peers never spend time in (median 0) yields finite JSON numbers."""
    trace = trace_of(CASES["healthy"].config(seed=0))
    col = trace.steps.phase_names.index("optimizer")
    trace.steps.phases[:, col] = 0.0
    trace.steps.phases[trace.steps.rank == 2, col] = 0.5
    doc = diagnose(trace).to_json()
    text = json.dumps(doc, allow_nan=False)  # raises on NaN/Infinity
    assert "optimizer" in text
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(2, "compute")]


def test_thresholds_can_be_set_by_name(trace_of):
    """``LEVEL.NAME=VALUE`` settings change what is reported; a bad one names itself."""
    import pytest

    from argus_core.detect.diagnose import DiagnoseConfig

    trace = trace_of(CASES["compute-straggler"].config(seed=0))
    strict = DiagnoseConfig().with_overrides(["l3.min_score=50", "l2.min_ratio=30"])
    assert strict.l3.min_score == 50 and strict.l2.min_ratio == 30
    doc = diagnose(trace, strict).to_json()
    assert doc["l3"]["stragglers"] == [] and doc["l2"]["stragglers"] == []
    assert diagnose(trace).to_json()["l3"]["stragglers"]  # the defaults find it
    for bad, message in (("l2.nope=1", "no threshold 'l2.nope'"), ("l2.alpha=x", "a float"),
                         ("alpha", "NAME=VALUE")):
        with pytest.raises(ValueError, match=message):
            DiagnoseConfig().with_overrides([bad])


def _with_cpu_wait(trace: Trace, rank: int, wait_s: float, from_step: int) -> Trace:
    """The trace with every step's ``cpu_wait_s`` recorded: 0.1 ms everywhere, ``wait_s`` on
    ``rank`` from ``from_step`` on."""
    table = trace.steps
    waits = np.full(len(table), 1e-4)
    waits[(table.rank == rank) & (table.step >= from_step)] = wait_s
    table.cpu_wait_s = waits
    return trace


def test_a_culprits_wait_for_a_cpu_counts_beyond_the_other_ranks_rise():
    """``cpu_wait_rise``, what makes an L1 culprit's compute regression host: its wait's rise
    from before the regression beyond the other ranks' rise (a load on the whole host raises
    every rank's wait and explains no one rank's slowdown), its own rise in a one-rank job."""
    from argus_core.detect.cpu_wait import cpu_wait_rise
    from argus_core.detect.steps import StepMatrix

    def matrix(waits: np.ndarray) -> StepMatrix:
        ranks, steps = waits.shape
        return StepMatrix(np.arange(ranks), np.arange(steps), np.arange(steps) * 10**9,
                          np.full(waits.shape, 0.05), np.full(waits.shape, 0.05),
                          np.zeros((ranks, steps, 0)), [], cpu_wait=waits)

    waits = np.full((4, 40), 1e-4)
    waits[:, 20:] += 0.005  # the whole host loaded from step 20
    waits[3, 20:] += 0.008  # and rank 3's core more
    assert cpu_wait_rise(matrix(waits), 3, 20) == pytest.approx(0.008)
    assert cpu_wait_rise(matrix(waits), 1, 20) == pytest.approx(0.0)
    assert cpu_wait_rise(matrix(waits[3:]), 0, 20) == pytest.approx(0.013)
    assert cpu_wait_rise(matrix(waits[3:]), 0, 20, 29) == pytest.approx(0.013)
    assert cpu_wait_rise(matrix(waits[3:]), 0, 2) is None  # two steps before: too few
    assert cpu_wait_rise(matrix(np.full((1, 40), np.nan)), 0, 20) is None


def test_a_slow_rank_that_waited_for_a_cpu_is_short_of_cpu_not_slow(trace_of):
    """Rank 5's phases stretch from step 15; when its training thread waited for a CPU that
    long too, the verdict is host (short of CPU); when it barely waited, compute."""
    config = CASES["compute-straggler"].config(seed=0)
    plain = diagnose(trace_of(config)).to_json()
    (verdict,) = plain["verdict"]
    cost = verdict["cost_s"]
    starved = diagnose(_with_cpu_wait(trace_of(config), 5, 0.9 * cost, 15)).to_json()
    assert [(v["rank"], v["cause"]) for v in starved["verdict"]] == [(5, "host")]
    assert starved["verdict"][0]["evidence"].startswith("short of CPU: its training thread "
                                                        "waited")
    assert starved["verdict"][0]["cost_s"] == cost  # the same cost, another cause
    barely = diagnose(_with_cpu_wait(trace_of(config), 5, 0.2 * cost, 15)).to_json()
    assert [(v["rank"], v["cause"]) for v in barely["verdict"]] == [(5, "compute")]
    everyone = diagnose(_with_cpu_wait(trace_of(config), 5, 1e-4, 0)).to_json()
    assert [(v["rank"], v["cause"]) for v in everyone["verdict"]] == [(5, "compute")]
