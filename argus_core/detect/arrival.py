"""Waiting inside collectives, measured from arrival skew (who entered the collective when).

A rank that reaches a collective before the last member of its group waits inside it, so its
collective phase is long although nothing is wrong with the link. For every collective phase
``{axis}-{op}``, step and rank this module splits the recorded time into ``wait`` (for the last
arriver) and ``transfer`` (the rest, what the link cost).

When did a rank arrive? Step records carry phase durations in the order the phases started
(not their start times), the step's host time ``wall_s`` and its device time ``gpu_s``. On its
own clock, rank r entered collective c of step t between

    a_lo = (sum of the phases recorded before c)
    a_hi = a_lo + idle + host_pre

``idle`` (gpu - sum of phases) is device time in no phase, a host stall in mid-step that may
lie before or after c; ``host_pre`` is host time before the step's device work began: a host
stall before the step. Durations alone cannot tell it from host time after the device work
(a rank that finished early), so it is bounded by wall - gpu, or measured exactly when the
device's start of the step is known (its first kernel, on the rank's clock: host_pre =
device start - t_ns, clipped to [0, wall - gpu]). Only per-rank differences are used, so
clock offsets between ranks cancel. A member's wait is then bounded twice:

    wait = clip(min(d - shortest d in the group,  latest a_hi in the group - a_lo), 0, d)

The first bound is physics (members of a collective finish together, so time beyond the
group's shortest can only be waiting); the second requires a late arriver: time beyond the
shortest with nobody entering later is the link's, not waiting. A group whose collective is
long for members that all arrived together is therefore seen as slow transfer.

Where the device's start is not known, ``idle + host_pre`` (time in no phase) may lie before
the collective (a late arrival) or after the rank's work (it finished early and waited for
the next step): durations alone cannot tell. The time most of a group spends there (its lower
median) is then taken as the group's common time, placed alike for every member, and only a
member's excess over it counts towards its arrival (``beyond_most``): a minority that stalls
still arrives late by its stall, but a majority with time in no phase no longer makes the few
members whose collectives are long (an asymmetric transfer: they finish the step last) into
waiters. Time before the step measured from the device's start is a late arrival as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.steps import StepMatrix
from argus_core.taxonomy import is_comm_phase, phase_axis
from argus_core.topology import axis_groups


@dataclass
class CollectiveTimes:
    """Per (rank, step, phase) waits and transfer times; per (rank, step) where time went.

    Arrays follow the StepMatrix layout; NaN where the phase was not recorded. Compute phases
    have no wait (their transfer is their time). ``host_s`` is wall - GPU time (before or
    after the step's device work), ``idle_s`` device time outside every phase.
    """

    wait: np.ndarray  # ranks x steps x phases
    transfer: np.ndarray  # ranks x steps x phases
    host_s: np.ndarray  # ranks x steps: wall - gpu
    idle_s: np.ndarray  # ranks x steps: gpu - sum of phases
    host_pre_s: np.ndarray  # ranks x steps: host time before the device's work, where the
    # device's start is known (NaN elsewhere): a stall, not slack after finishing early
    compute_s: np.ndarray  # ranks x steps: sum of compute phases
    comm_s: np.ndarray  # ranks x steps: sum of collective transfer times
    wait_s: np.ndarray  # ranks x steps: sum of waits

    @property
    def own_host_s(self) -> np.ndarray:
        """Host time that is the rank's own doing: before the step's device work where the
        device's start is known (a rank that finished early and waited on the host for the
        next step is not stalling), elsewhere all of wall - GPU, which cannot tell the two
        apart."""
        return np.where(np.isfinite(self.host_pre_s), self.host_pre_s, self.host_s)

    @property
    def slack_s(self) -> np.ndarray:
        """Time a rank spent not on its own work: waiting in collectives, host and idle gaps."""
        return self.wait_s + self.host_s + self.idle_s


def group_reduce(values: np.ndarray, gid: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """``ufunc`` (np.fmax, np.fmin) over the rows of each group: (groups x ...) from (rows x
    ...). NaN entries are ignored where the ufunc ignores them."""
    order = np.argsort(gid, kind="stable")
    sorted_gid = gid[order]
    starts = np.flatnonzero(np.r_[True, sorted_gid[1:] != sorted_gid[:-1]])
    out = np.full((int(gid.max()) + 1, *values.shape[1:]), np.nan)
    out[sorted_gid[starts]] = ufunc.reduceat(values[order], starts, axis=0)
    return out


def beyond_most(slack: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Each row's ``slack`` (ranks x ...; NaN: not recorded, ignored) beyond its group's lower
    median of it (the most that at least half the members reach), never below 0; NaN stays.

    Time in no phase that most members of a collective's group spend is the group's common
    time (host work after the step, or waiting for the next one), not a late arrival: a
    member can arrive after its peers only by what it spends beyond them. For a pair the
    lower median is the smaller slack, so one member's stall is still all a late arrival."""
    order = np.argsort(gid, kind="stable")
    sorted_gid = gid[order]
    sizes = np.bincount(sorted_gid)
    position = np.arange(len(order)) - (np.cumsum(sizes) - sizes)[sorted_gid]
    padded = np.full((len(sizes), int(sizes.max()), *slack.shape[1:]), np.nan)
    padded[sorted_gid, position] = slack[order]
    padded.sort(axis=1)  # NaN last
    valid = np.sum(~np.isnan(padded), axis=1)
    lower = np.take_along_axis(padded, (np.maximum(valid - 1, 0) // 2)[:, None], axis=1)[:, 0]
    with np.errstate(invalid="ignore"):
        return np.maximum(slack - lower[gid], 0.0)


def collective_times(matrix: StepMatrix, coords: np.ndarray,
                     device_start_ns: np.ndarray | None = None) -> CollectiveTimes:
    """Split every collective phase of every rank and step into waiting and transfer.

    ``device_start_ns`` (ranks x steps, -1 where unknown) is when each step's device work
    began on the rank's clock, e.g. its first kernel: it separates a host stall before the
    step from host time after it.
    """
    phases = matrix.phases
    filled = np.nan_to_num(phases)
    before = np.cumsum(filled, axis=2) - filled  # phases recorded earlier in the step
    total = filled.sum(axis=2)
    has_gpu = np.isfinite(matrix.gpu)
    wall = np.nan_to_num(matrix.wall)
    host = np.where(has_gpu, np.maximum(wall - np.nan_to_num(matrix.gpu), 0.0), 0.0)
    device = np.where(has_gpu, np.nan_to_num(matrix.gpu), wall)
    idle = np.maximum(device - total, 0.0)
    host_pre = host
    measured_pre = np.full(host.shape, np.nan)
    if device_start_ns is not None and matrix.host_ns is not None:
        known = (device_start_ns >= 0) & (matrix.host_ns >= 0)
        measured = np.clip((device_start_ns - matrix.host_ns) * 1e-9, 0.0, host)
        measured_pre = np.where(known, measured, np.nan)
        host_pre = np.where(known, measured, host)
    slack = np.where(np.isnan(matrix.wall), np.nan, idle + host_pre)  # time in no phase
    wait = np.zeros_like(phases)
    comm_cols = []
    for col, name in enumerate(matrix.phase_names):
        axis = phase_axis(name)
        if not is_comm_phase(name):
            continue
        comm_cols.append(col)
        if axis is None or len(matrix.ranks) < 2:
            continue
        gid = axis_groups(coords, axis)
        d = phases[:, :, col]
        a_lo = before[:, :, col]
        late = np.where(np.isfinite(measured_pre), idle + host_pre,
                        beyond_most(slack, gid))  # unplaced time: beyond the group's
        last = group_reduce(a_lo + late, gid, np.fmax)[gid]
        shortest = group_reduce(d, gid, np.fmin)[gid]
        with np.errstate(invalid="ignore"):
            wait[:, :, col] = np.clip(np.minimum(d - shortest, last - a_lo), 0.0, d)
    wait[np.isnan(phases)] = np.nan
    transfer = phases - np.nan_to_num(wait)
    compute = np.ones(len(matrix.phase_names), dtype=bool)
    compute[comm_cols] = False
    return CollectiveTimes(
        wait=wait, transfer=transfer, host_s=host, idle_s=idle, host_pre_s=measured_pre,
        compute_s=np.nansum(phases[:, :, compute], axis=2),
        comm_s=np.nansum(transfer[:, :, ~compute], axis=2),
        wait_s=np.nansum(wait, axis=2))
