"""Faults the first diagnosis missed, end to end through the simulator: every sustained
slowdown gets a verdict, whatever level saw it, on jobs with real clocks and real stages."""

from __future__ import annotations

import pytest
from support import seeds

from argus_core.detect.diagnose import diagnose
from argus_core.simulate import SimConfig, parse_fault, simulate_trace
from argus_core.topology import Topology

REALISTIC = dict(rank_spread=0.02, clock_offset_s=0.003, clock_jitter_s=0.002)


def verdicts(doc: dict) -> dict[int, str]:
    return {v["rank"]: v["cause"] for v in doc["verdict"]}


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("seed", range(3))
def test_sustained_host_straggler_gets_a_verdict(dp, seed):
    """Rank 1 sleeps 120 ms on the host before every all-reduce from step 8 on: its peers
    wait 99% of their all-reduce for it. Verdict host for rank 1, naming the steps and size;
    nobody else is blamed."""
    config = SimConfig(topology=Topology(dp=dp), steps=30, seed=seed, **REALISTIC,
                       faults=(parse_fault("stall:ranks=1:from=8:seconds=0.12:before=dp"),))
    doc = diagnose(simulate_trace(config)).to_json()
    assert verdicts(doc) == {1: "host"}, doc["verdict"]
    evidence = doc["verdict"][0]["evidence"]
    assert "from step 8 to 29" in evidence and "+120.0 ms a step" in evidence


@pytest.mark.parametrize("seed", seeds(4))
def test_the_same_stall_at_two_steps_is_a_host_spike(seed):
    """The stall at steps 12 and 20 only: two spikes, the same verdict."""
    config = SimConfig(topology=Topology(dp=4), steps=30, seed=seed, **REALISTIC,
                       faults=(parse_fault("stall:ranks=1:steps=12,20:seconds=0.12:before=dp"),))
    doc = diagnose(simulate_trace(config)).to_json()
    assert [s["step"] for s in doc["l1"]["spikes"]] == [12, 20]
    assert verdicts(doc) == {1: "host"}


@pytest.mark.parametrize("seed", seeds(3))
def test_late_straggler_at_scale_is_not_diluted(seed):
    """512 ranks, 3x kernel noise, rank 77 1.3x slower from step 15 of 30: found as compute,
    judged on its own slow steps."""
    fault = parse_fault("compute:ranks=77:phases=attention*1.3,mlp*1.3,backward*1.3:from=15")
    config = SimConfig(topology=Topology(dp=64, tp=8), steps=30, seed=seed, noise=0.09,
                       kernel_every=3, **REALISTIC, faults=(fault,))
    d = diagnose(simulate_trace(config))
    assert verdicts(d.to_json()) == {77: "compute"}
    onsets = {f.onset for f in d.l2.findings if f.rank == 77} - {None}
    ratios = [f.ratio for f in d.l2.findings if f.rank == 77]
    assert max(ratios) >= 1.25
    assert not onsets or all(abs(o - 15) <= 2 for o in onsets)


@pytest.mark.parametrize("seed", seeds(4))
def test_slow_link_with_nobody_late_is_communication(seed):
    """TP group 4-7's collectives 4x slower, every member arriving on time: a slow link for
    exactly that group, with what it costs the job."""
    config = SimConfig(topology=Topology(tp=4, dp=4), steps=20, seed=seed, **REALISTIC,
                       faults=(parse_fault("link:ranks=4-7:axis=tp:factor=4"),))
    doc = diagnose(simulate_trace(config)).to_json()
    assert verdicts(doc) == {r: "communication" for r in (4, 5, 6, 7)}
    assert all(v["cost_share"] >= 0.02 for v in doc["verdict"])


@pytest.mark.parametrize("seed", seeds(4))
def test_a_slow_link_that_costs_under_the_floor_is_minor(seed):
    """The same group 1.5x slower costs the job under 1% of its step (its collectives are
    short): found at L2 and L3, reported as minor with its cost, and no verdict."""
    config = SimConfig(topology=Topology(tp=4, dp=4), steps=20, seed=seed, **REALISTIC,
                       faults=(parse_fault("link:ranks=4-7:axis=tp:factor=1.5"),))
    doc = diagnose(simulate_trace(config)).to_json()
    assert {s["rank"] for s in doc["l2"]["stragglers"]} == {4, 5, 6, 7}
    assert doc["verdict"] == []
    assert {m["rank"]: m["cause"] for m in doc["minor"]} == {r: "communication"
                                                             for r in (4, 5, 6, 7)}
    assert all(0 < m["cost_share"] < 0.02 for m in doc["minor"])


@pytest.mark.parametrize("seed", seeds(3))
@pytest.mark.parametrize("rank", [5, 13])  # a middle stage, and the heavy last stage
def test_straggler_found_among_unequal_stages(rank, seed):
    """pp=4 with a heavier first and last stage, clocks offset: a 1.4x rank is found and the
    heavy stages are not blamed for their extra work."""
    fault = parse_fault(f"compute:ranks={rank}:phases=attention*1.4,mlp*1.4,backward*1.4")
    config = SimConfig(topology=Topology(pp=4, dp=4), steps=20, seed=seed, unequal_stages=True,
                       count_jitter=0.05, **REALISTIC, faults=(fault,))
    doc = diagnose(simulate_trace(config)).to_json()
    assert verdicts(doc) == {rank: "compute"}


@pytest.mark.parametrize(("topology", "rank"), [("dp=8,tp=2", 5), ("dp=8,tp=4,pp=2", 21)])
def test_a_tail_only_kernel_fault_is_found(topology, rank):
    """A tenth of one rank's dgrad GEMMs 3x slower: the kernel costs it 20% more time with
    its median unchanged. Found as compute on that rank in every seed, nobody else blamed
    (the rank's fattened tail does not widen its own fence)."""
    fault = parse_fault(f"tail:ranks={rank}:kernel=dgrad:share=0.1:factor=3")
    for seed in range(4):
        config = SimConfig(topology=Topology.parse(topology), steps=60, seed=seed,
                           kernel_every=2, **REALISTIC, faults=(fault,))
        doc = diagnose(simulate_trace(config)).to_json()
        assert verdicts(doc) == {rank: "compute"}, (seed, doc["verdict"])
        assert any(s["rank"] == rank and "dgrad" in s["kernel"]
                   for s in doc["l3"]["stragglers"])
