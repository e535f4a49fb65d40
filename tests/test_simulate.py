"""The simulator: valid schema-v1 output, synchronous-collective physics, fault specs."""

from __future__ import annotations

import numpy as np
import pytest

from argus_core.reader import load_traces
from argus_core.simulate import (
    CASES,
    SimConfig,
    parse_fault,
    simulate,
    simulate_trace,
    write_records,
)
from argus_core.topology import Topology, axis_groups


def test_every_record_is_valid_schema_v1(tmp_path):
    """Files written by the simulator load with zero rejects, one file per rank."""
    paths = write_records(simulate(CASES["misleading-network"].config(seed=1)), tmp_path,
                          compress=True)
    assert len(paths) == 16 and all(p.suffix == ".gz" for p in paths)
    result = load_traces([tmp_path])
    assert result.rejected == 0
    trace = result.traces["misleading-network"]
    assert len(trace.ranks) == 16 and len(trace.steps) == 16 * 40
    assert len(trace.kernels) > 16 * 40 * 50


def test_collectives_make_early_ranks_wait(trace_of):
    """The slow rank's collective is short and its peers' long: they wait for it, as on GPUs."""
    trace = trace_of(CASES["compute-straggler"].config(seed=0))
    steps = trace.steps
    col = steps.phase_names.index("dp-allreduce")
    late = steps.phases[(steps.rank == 5) & (steps.step >= 15), col]
    waiting = steps.phases[(steps.rank == 0) & (steps.step >= 15), col]
    assert np.median(waiting) > 20 * np.median(late)
    # Synchronous steps: every rank's step takes about as long as the slowest.
    walls = steps.wall_s[steps.step == 30]
    assert walls.max() / walls.min() < 1.01


def test_link_fault_slows_the_whole_collective_group(trace_of):
    """A degraded link slows every member of that TP group, not only the named ranks."""
    config = SimConfig(topology=Topology(tp=4, dp=2), steps=5,
                       faults=(parse_fault("link:ranks=5:axis=tp:factor=10"),))
    trace = trace_of(config)
    col = trace.steps.phase_names.index("tp-comm")
    per_rank = [np.median(trace.steps.phases[trace.steps.rank == r, col]) for r in range(8)]
    assert min(per_rank[4:]) > 5 * max(per_rank[:4])


@pytest.mark.parametrize("spec", [
    "compute:ranks=5:phases=attention*25,mlp*20:from=15",
    "link:ranks=4-7:axis=tp:factor=8:ops=AllGather*12,ReduceScatter*20:from=0",
    "link:ranks=4,5:axis=tp:factor=3:from=2:local=1",
    "stall:ranks=3:steps=12,27:seconds=2.5",
    "stall:ranks=1:from=8:seconds=0.12:before=dp",
    "tail:ranks=5:kernel=dgrad:share=0.1:factor=6:from=0",
])
def test_fault_spec_round_trip(spec):
    """Fault specs parse and print back to the same text."""
    assert str(parse_fault(spec)) == spec


@pytest.mark.parametrize("spec, message", [
    ("slow:ranks=1", "kind must be"),
    ("compute:ranks=1", "missing phases="),
    ("link:ranks=1:axis=tp:factor=x", "factor"),
    ("stall:ranks=1:steps=2:seconds=1:color=red", "unknown key"),
    ("stall:ranks=1:seconds=1", "needs steps=N,M or from=N"),
    ("link:ranks=1:axis=tp:factor=2:local=yes", "local must be 0 or 1"),
    ("compute:ranks=1:phases", "expected key=value"),
    ("tail:ranks=1:kernel=dgrad:share=1.5:factor=2", "share must be in"),
    ("tail:ranks=1:kernel=dgrad:factor=2", "missing share="),
])
def test_bad_fault_specs(spec, message):
    """A bad fault spec is refused with a message naming what is wrong."""
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


def test_tail_fault_slows_a_share_of_one_kernels_executions():
    """A tail fault slows exactly its share of the named kernel's executions on its rank,
    spread over the steps (its median unchanged); other kernels and ranks are untouched, and
    a kernel name nothing matches is refused."""
    fault = parse_fault("tail:ranks=2:kernel=dgrad:share=0.1:factor=6")
    base = simulate_trace(SimConfig(topology=Topology(dp=4), steps=40, seed=1))
    slow = simulate_trace(SimConfig(topology=Topology(dp=4), steps=40, seed=1, faults=(fault,)))
    dgrad = [i for i, n in enumerate(base.kernels.names) if "dgrad" in n]
    mine = (base.kernels.rank == 2) & np.isin(base.kernels.name, dgrad)
    ratio = slow.kernels.dur_ns[mine] / base.kernels.dur_ns[mine]
    assert np.mean(ratio > 3) == pytest.approx(0.1, abs=0.02)
    assert np.median(ratio) == pytest.approx(1.0, abs=0.01)
    from argus_core.taxonomy import is_comm_kernel

    compute = ~np.array([is_comm_kernel(n) for n in base.kernels.names])[base.kernels.name]
    others = compute & (base.kernels.rank != 2)  # their collectives wait for rank 2
    assert np.array_equal(slow.kernels.dur_ns[others], base.kernels.dur_ns[others])
    with pytest.raises(ValueError, match="no kernel name contains 'nope'"):
        SimConfig(topology=Topology(dp=4), faults=(parse_fault(
            "tail:ranks=1:kernel=nope:share=0.1:factor=2"),))


def test_fault_rank_outside_world():
    """Faults naming ranks outside the world are refused up front."""
    with pytest.raises(ValueError, match="rank 8 outside world size 8"):
        SimConfig(topology=Topology(dp=8), faults=(parse_fault("compute:ranks=8:phases=mlp*2"),))


def test_topology_coords_and_groups():
    """Megatron order (tp fastest, pp slowest) and X-groups of ranks equal elsewhere."""
    topo = Topology.parse("dp=2,tp=2,pp=2")
    coords = topo.coords()
    assert topo.world_size == 8
    assert coords[5].tolist() == [0, 1, 1, 0]  # dp, tp, pp, ep
    tp_groups = axis_groups(coords, "tp")
    assert tp_groups[0] == tp_groups[1] != tp_groups[2]
    with pytest.raises(ValueError, match="bad topology"):
        Topology.parse("dp=2,xx=3")


REALISTIC = SimConfig(topology=Topology(dp=2, tp=2, pp=3), steps=12, seed=3, rank_spread=0.02,
                      clock_offset_s=0.003, clock_jitter_s=0.002, count_jitter=0.05,
                      unequal_stages=True,
                      faults=(parse_fault("stall:ranks=1:from=8:seconds=0.12:before=dp"),))


def test_direct_trace_equals_the_records(trace_of):
    """simulate_trace (columns, no records) builds exactly what reading simulate's records
    through the schema parser builds."""
    from_records, direct = trace_of(REALISTIC), simulate_trace(REALISTIC)
    for name in ("rank", "step", "t_ns", "wall_s", "gpu_s", "phases"):
        np.testing.assert_array_equal(getattr(from_records.steps, name),
                                      getattr(direct.steps, name))
    assert from_records.steps.phase_names == direct.steps.phase_names
    for name in ("rank", "name", "stream", "start_ns", "dur_ns"):
        np.testing.assert_array_equal(getattr(from_records.kernels, name),
                                      getattr(direct.kernels, name))
    assert [(s.rank, s.t_ns, s.frames) for s in from_records.stacks] == [
        (s.rank, s.t_ns, s.frames) for s in direct.stacks]


def test_each_rank_has_its_own_clock():
    """Clock offsets shift all of a rank's times; the host's step start leads the device's
    (never follows it); steps and kernels of one rank stay on one clock."""
    trace = simulate_trace(REALISTIC)
    steps, k = trace.steps, trace.kernels
    offsets = [steps.t_ns[(steps.rank == r) & (steps.step == 0)][0] for r in range(12)]
    assert max(offsets) - min(offsets) > 1_000_000  # milliseconds apart
    for r in range(12):
        starts = steps.t_ns[steps.rank == r]
        first_kernel = [k.start_ns[(k.rank == r) & (k.start_ns >= s)].min() for s in starts]
        lead = np.array(first_kernel) - starts
        assert (lead >= 0).all() and (lead < 20_000_000).all()


def test_unequal_stages_and_moe_jitter():
    """First stage embeds, last stage computes the LM head; expert kernels' executions vary
    per rank and step; the other kernels run the same number of times everywhere."""
    trace = simulate_trace(REALISTIC)
    k = trace.kernels
    pp = trace.coords(np.arange(12))[:, 2]

    def ranks_running(name):
        return set(np.unique(k.rank[k.name == k.names.index(name)]).tolist())

    assert ranks_running("embedding_fwd_kernel") == set(np.flatnonzero(pp == 0).tolist())
    assert ranks_running("sm90_xmma_gemm_bf16_lm_head") == set(np.flatnonzero(pp == 2).tolist())

    def per_rank(name):
        return np.bincount(k.rank[k.name == k.names.index(name)], minlength=12)

    assert len(set(per_rank("sm90_xmma_gemm_bf16_mlp_fc1").tolist())) > 1
    assert len(set(per_rank("flash_fwd_kernel").tolist())) == 1


def test_stall_inside_the_step_idles_the_device():
    """A stall before the all-reduce: the rank's GPU time grows by it while no phase does;
    its peers' all-reduce absorbs it as waiting."""
    trace = simulate_trace(REALISTIC)
    s = trace.steps
    total = np.nansum(s.phases, axis=1)
    idle = s.gpu_s - total
    late = (s.rank == 1) & (s.step >= 8)
    assert np.all(idle[late] > 0.11) and np.all(idle[~late] < 0.01)
    col = s.phase_names.index("dp-allreduce")
    partner = (s.rank == 3) & (s.step >= 8)  # rank 1's dp partner (tp=2)
    assert np.all(s.phases[partner, col] > 0.11)


def test_kernels_recorded_in_one_step_of_n():
    """kernel_every=3 records kernels in steps 0, 3, 6, ... only (the exporter's duty cycle)."""
    config = SimConfig(topology=Topology(dp=2), steps=7, kernel_every=3)
    trace = simulate_trace(config)
    step_of = np.searchsorted(np.unique(trace.steps.t_ns), trace.kernels.start_ns,
                              side="right") - 1
    assert sorted(set(step_of.tolist())) == [0, 3, 6]
