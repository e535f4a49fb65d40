"""The simulator: valid schema-v1 output, synchronous-collective physics, fault specs."""

from __future__ import annotations

import numpy as np
import pytest

from argus_core.reader import load_traces
from argus_core.simulate import CASES, SimConfig, parse_fault, simulate, write_records
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
    "stall:ranks=3:steps=12,27:seconds=2.5",
])
def test_fault_spec_round_trip(spec):
    """Fault specs parse and print back to the same text."""
    assert str(parse_fault(spec)) == spec


@pytest.mark.parametrize("spec, message", [
    ("slow:ranks=1", "kind must be"),
    ("compute:ranks=1", "missing phases="),
    ("link:ranks=1:axis=tp:factor=x", "factor"),
    ("stall:ranks=1:steps=2:seconds=1:color=red", "unknown key"),
    ("compute:ranks=1:phases", "expected key=value"),
])
def test_bad_fault_specs(spec, message):
    """A bad fault spec is refused with a message naming what is wrong."""
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


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
