"""Collective kernels with the wait for the last arriver removed: their transfer time.

A collective kernel starts when its rank reaches it and spins until every member has, so an
early rank's NCCL kernel is long without anything wrong with the link. Every execution of a
collective kernel is matched across the ranks of its group by (step, kernel, stream, k-th
execution of that kernel in the step).

Which group a collective ran in is not recorded. Members of one collective finish together,
so for each (kernel, stream) the group is the X-group (ranks equal on every other axis) in
which executions end closest together, measured from each rank's start of the step on its
own clock (clock offsets between ranks cancel); the L3 peer set when the trace has no axes.

Within that group, as for phases (``arrival``):

    wait = clip(min(d - shortest d of the execution,
                    (1 + ARRIVAL_TOLERANCE) x (latest arrival - own arrival)), 0, d)

The first bound is exact for a synchronous collective; the second needs someone to have
arrived later. Arrivals are measured from anchors that jitter between ranks by a few ms (a
host leads its device by a varying amount), so the second bound is taken with
``ARRIVAL_TOLERANCE`` to spare: a rank that waited 110 ms for a late peer must not keep 4 ms
of it as "transfer" on a 0.4 ms kernel, while a kernel slow with nobody arriving later keeps
all of its time. Arrival is measured from three anchors of the rank's step (its first kernel,
the host's step start ``t_ns``, which also counts a host stall before the step, and the end
of its previous step's last kernel) and the most lenient is kept. The kernel is scored on
``d - wait``: a rank that only waited looks like its peers, while a collective that is slow
for its whole group stays slow (a slow link).
"""

from __future__ import annotations

import numpy as np

from argus_core.stats.grouping import dense_ids
from argus_core.taxonomy import is_comm_kernel
from argus_core.trace import KernelTable

ARRIVAL_TOLERANCE = 0.25  # the arrival bound, widened by this share of itself


def transfer_durations(kernels: KernelTable, step_col: np.ndarray, groups: list[np.ndarray],
                       host_start_ns: np.ndarray) -> np.ndarray:
    """Kernel durations with each collective execution's arrival wait removed (int64 ns).

    ``step_col`` is each kernel's step (-1: not placed, left unchanged); ``groups`` holds,
    per candidate grouping, the group id of each kernel's rank (its X-group on every axis of
    the job); ``host_start_ns`` the host start of each kernel's step on its rank.
    """
    dur = kernels.dur_ns.astype(np.int64).copy()
    comm_name = np.array([is_comm_kernel(n) for n in kernels.names], dtype=bool)
    placed = step_col >= 0
    comm = placed & comm_name[kernels.name]
    if not comm.any() or not groups:
        return dur
    rank_row, _ = dense_ids(kernels.rank[placed])
    n_slots = int(step_col.max()) + 2  # one spare slot per rank: "no previous step"
    rank_of = np.full(len(kernels), -1, dtype=np.int64)
    rank_of[placed] = rank_row
    slot = rank_of * n_slots + step_col + 1
    size = int(rank_row.max() + 1) * n_slots
    first_start = np.full(size, np.iinfo(np.int64).max)
    np.minimum.at(first_start, slot[placed], kernels.start_ns[placed])
    last_end = np.full(size, np.iinfo(np.int64).min)
    np.maximum.at(last_end, slot[placed], kernels.start_ns[placed] + dur[placed])

    idx = np.flatnonzero(comm)
    s = slot[idx]
    start, d = kernels.start_ns[idx], dur[idx]
    step_start = first_start[s]
    anchors = [step_start, np.minimum(host_start_ns[idx], step_start)]
    previous = last_end[s - 1]
    anchors.append(np.where(previous > np.iinfo(np.int64).min,
                            np.minimum(previous, step_start), step_start))
    name = kernels.name[idx].astype(np.int64)
    stream = kernels.stream[idx]
    occurrence = _occurrence(rank_of[idx], step_col[idx], name, stream, start)
    group = _collective_group(groups, idx, step_col[idx], name, stream, occurrence,
                              start + d - step_start)
    execution, _ = dense_ids(group, step_col[idx], name, stream, occurrence)
    n_exec = int(execution.max()) + 1
    shortest = np.full(n_exec, np.iinfo(np.int64).max)
    np.minimum.at(shortest, execution, d)
    cap = np.zeros(len(idx), dtype=np.int64)
    for anchor in anchors:
        arrival = start - anchor
        latest = np.full(n_exec, np.iinfo(np.int64).min)
        np.maximum.at(latest, execution, arrival)
        np.maximum(cap, latest[execution] - arrival, out=cap)
    cap = cap + (cap * ARRIVAL_TOLERANCE).astype(np.int64)
    wait = np.clip(np.minimum(d - shortest[execution], cap), 0, d)
    dur[idx] = d - wait
    return dur


def _occurrence(rank: np.ndarray, step: np.ndarray, name: np.ndarray, stream: np.ndarray,
                start: np.ndarray) -> np.ndarray:
    """k for the k-th execution (by start time) of a kernel on a stream in a rank's step."""
    series, _ = dense_ids(rank, step, name, stream)
    order = np.lexsort((start, series))
    sorted_series = series[order]
    run_start = np.flatnonzero(np.r_[True, sorted_series[1:] != sorted_series[:-1]])
    occurrence = np.empty(len(series), dtype=np.int64)
    occurrence[order] = np.arange(len(series)) - np.repeat(
        run_start, np.diff(np.r_[run_start, len(series)]))
    return occurrence


def _collective_group(groups: list[np.ndarray], idx: np.ndarray, step: np.ndarray,
                      name: np.ndarray, stream: np.ndarray, occurrence: np.ndarray,
                      end: np.ndarray) -> np.ndarray:
    """Group id of each collective execution: per (kernel, stream), the candidate grouping
    whose executions end closest together (median spread of the members' ends)."""
    if len(groups) == 1:
        return groups[0][idx]
    unit, _ = dense_ids(name, stream)
    n_units = int(unit.max()) + 1
    spreads = np.full((len(groups), n_units), np.inf)
    for g, group in enumerate(groups):
        execution, (_, _, e_name, e_stream, _) = dense_ids(group[idx], step, name, stream,
                                                           occurrence)
        n_exec = int(execution.max()) + 1
        lo = np.full(n_exec, np.iinfo(np.int64).max)
        hi = np.full(n_exec, np.iinfo(np.int64).min)
        np.minimum.at(lo, execution, end)
        np.maximum.at(hi, execution, end)
        members = np.bincount(execution, minlength=n_exec)
        e_unit, _ = dense_ids(e_name, e_stream)
        # e_unit numbers (kernel, stream) pairs in the same sorted order as ``unit``
        shared = members >= 2
        for u in np.unique(e_unit[shared]).tolist():
            spreads[g, u] = float(np.median((hi - lo)[shared & (e_unit == u)]))
    best = np.argmin(spreads, axis=0)
    choice = best[unit]
    out = np.empty(len(idx), dtype=np.int64)
    offset = 0
    for g, group in enumerate(groups):  # distinct ids across groupings
        mine = choice == g
        out[mine] = group[idx[mine]] + offset
        offset += int(group.max()) + 1
    return out
