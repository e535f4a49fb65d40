"""Kernels into steps rank by rank, the time-base check, pipeline stage classes, and
collective kernels' transfer times."""

from __future__ import annotations

import numpy as np

from argus_core.detect.kernel_waits import transfer_durations
from argus_core.detect.placement import place_kernels
from argus_core.detect.stages import stage_classes
from argus_core.detect.steps import step_matrix, step_start_ns
from argus_core.simulate import SimConfig, simulate_trace
from argus_core.topology import Topology, axis_groups
from argus_core.trace import KernelTable


def kernels(rank, start, dur=None, name=None, names=("k",)) -> KernelTable:
    rank = np.asarray(rank, dtype=np.int64)
    n = len(rank)
    return KernelTable(rank, np.zeros(n, np.int32) if name is None else np.asarray(name, np.int32),
                       np.full(n, 7), np.asarray(start, np.int64),
                       np.full(n, 1000, np.int64) if dur is None else np.asarray(dur, np.int64),
                       list(names))


def test_kernels_are_placed_by_their_own_ranks_clock():
    """Rank 1's clock runs 30 ms ahead: its kernels land in its own steps, where a job-wide
    step start would put the first ones of every step into the previous step."""
    trace = simulate_trace(SimConfig(topology=Topology(dp=2), steps=6, clock_offset_s=0.0))
    m = step_matrix(trace.steps)
    m.start_ns[1] += 30_000_000
    m.host_ns[1] += 30_000_000
    k = kernels([0, 1, 1], [m.start_ns[0, 2] + 1000, m.start_ns[1, 2] + 1000,
                            m.start_ns[1, 3] - 1000])
    placement = place_kernels(k, m)
    assert placement.step_col.tolist() == [2, 2, 2]
    job_wide = np.searchsorted(m.t_ns, k.start_ns, side="right") - 1
    assert job_wide.tolist() != [2, 2, 2]


def test_kernels_on_another_time_base_are_reported():
    """Kernels of rank 3 stamped on a different clock (seconds away) are named in a warning
    and left out, the other ranks' are placed."""
    trace = simulate_trace(SimConfig(topology=Topology(dp=4), steps=6))
    m = step_matrix(trace.steps)
    k = trace.kernels
    shifted = k.start_ns.copy()
    shifted[k.rank == 3] -= 3_600 * 10**9  # an hour off
    placement = place_kernels(KernelTable(k.rank, k.name, k.stream, shifted, k.dur_ns,
                                          k.names), m)
    assert len(placement.warnings) == 1 and "rank(s): 3 (100%" in placement.warnings[0]
    assert placement.outside[k.rank == 3].all() and not placement.outside[k.rank != 3].any()
    assert (placement.step_col[k.rank != 3] >= 0).all()


def test_step_starts_prefer_the_device_anchor():
    """Kernels are placed by ``gpu_t_ns`` where the exporter records it, else ``t_ns``."""
    trace = simulate_trace(SimConfig(topology=Topology(dp=2), steps=3))
    table = trace.steps
    assert np.array_equal(step_start_ns(table), table.t_ns)
    table.gpu_t_ns = np.where(table.step == 1, table.t_ns + 5_000_000, -1)
    starts = step_start_ns(table)
    assert np.array_equal(starts[table.step == 1], table.t_ns[table.step == 1] + 5_000_000)
    assert np.array_equal(starts[table.step != 1], table.t_ns[table.step != 1])


def test_unequal_stages_get_their_own_class():
    """First and last stages run extra kernels (embedding, LM head): three classes, the
    middle stages alike; with equal stages, one class."""
    for unequal, expected in ((True, [0, 1, 1, 2]), (False, [0, 0, 0, 0])):
        trace = simulate_trace(SimConfig(topology=Topology(pp=4, dp=2), steps=4,
                                         unequal_stages=unequal))
        m = step_matrix(trace.steps)
        placement = place_kernels(trace.kernels, m)
        coords = trace.coords(m.ranks)
        classes = stage_classes(trace.kernels, placement.step_col, m.ranks, coords)
        by_stage = [int(classes[coords[:, 2] == s][0]) for s in range(4)]
        assert len(set(by_stage)) == len(set(expected))
        assert (by_stage[1] == by_stage[2]) and (unequal != (by_stage[0] == by_stage[1]))


def test_waiting_is_removed_from_collective_kernels():
    """Rank 2 arrives 5 ms late at an all-reduce: the others' kernels spin for those 5 ms.
    Their transfer time is the last arriver's; nobody's exceeds the shortest."""
    start = np.array([10, 10, 15, 10]) * 1_000_000
    dur = np.array([6, 6, 1, 6]) * 1_000_000
    k = kernels([0, 1, 2, 3], start, dur, names=("ncclDevKernel_AllReduce_Sum",))
    host = np.zeros(4, dtype=np.int64)
    groups = [axis_groups(Topology(dp=4).coords(), "dp")[k.rank]]
    out = transfer_durations(k, np.zeros(4, dtype=np.int64), groups, host)
    assert out.tolist() == [1_000_000] * 4


def test_slow_link_kernels_keep_their_time():
    """The same collective 5x longer on every member of one group, all arriving together:
    nothing is waiting, the kernels keep their duration."""
    start = np.full(8, 10_000_000)
    dur = np.array([5, 5, 5, 5, 1, 1, 1, 1]) * 1_000_000
    k = kernels(np.arange(8), start, dur, names=("ncclDevKernel_AllGather",))
    coords = Topology(tp=4, dp=2).coords()
    groups = [axis_groups(coords, a)[k.rank] for a in ("tp", "dp")]
    out = transfer_durations(k, np.zeros(8, dtype=np.int64), groups, np.zeros(8, np.int64))
    assert out.tolist() == dur.tolist()
