"""The paper's five case studies and healthy runs, end to end through schema and diagnosis."""

from __future__ import annotations

import pytest

from argus_core.detect.diagnose import diagnose
from argus_core.simulate import CASES

SEEDS = range(20)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(CASES))
def test_case_is_diagnosed(name, seed, trace_of):
    """Right rank, phase, kernel and verdict for each case; healthy runs report nothing."""
    case = CASES[name]
    doc = diagnose(trace_of(case.config(seed=seed))).to_json()
    assert case.expect.mismatches(doc) == []


@pytest.mark.parametrize("noise", [0.01, 0.06])
def test_healthy_at_other_noise_levels(noise, trace_of):
    """More or less kernel jitter does not create findings in a healthy job."""
    doc = diagnose(trace_of(CASES["healthy"].config(seed=3, noise=noise))).to_json()
    assert CASES["healthy"].expect.mismatches(doc) == []


def test_large_healthy_job_is_silent(trace_of):
    """A 256-rank healthy job (many groups, many tests) reports nothing at any level."""
    from argus_core.simulate.model import SimConfig
    from argus_core.topology import Topology

    trace = trace_of(SimConfig(job="big", topology=Topology(dp=16, tp=4, pp=4), steps=20,
                               seed=7))
    assert CASES["healthy"].expect.mismatches(diagnose(trace).to_json()) == []


def test_waiting_ranks_are_not_blamed(trace_of):
    """Case 1: the seven ranks that wait in dp-allreduce are victims, never stragglers."""
    trace = trace_of(CASES["compute-straggler"].config(seed=0))
    d = diagnose(trace)
    roles = {(r.rank, r.role) for r in d.l2.roles if r.phase == "dp-allreduce"}
    assert {(r, "waiter") for r in (0, 1, 2, 3, 4, 6, 7)} <= roles
    assert (5, "late") in roles
    assert {v.rank for v in d.verdicts} == {5}
