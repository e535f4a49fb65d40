"""L2: straggler rank and phase, parallelism-aware (paper section 6, case studies 1, 3, 5).

Ranks are only compared with the peers of their X-group on each axis X (ranks equal on every
other coordinate): they do the same work in lock-step. Per rank and phase the statistic is the
median phase time over the steady steps (no warm-up, no spikes, after the last regression).

- Compute phases: a rank is a straggler when its time is at least ``min_ratio`` times the
  median of its other group members and its robust z (median/MAD, which has no small-sample
  ceiling) exceeds ``z_threshold``.
- Communication phases (``{axis}-...``) are analysed on their own axis. Inside a collective,
  early ranks wait for the last one, so a long collective on one rank is waiting, not a slow
  link: its wait is its time minus the group's shortest. Ranks that mostly wait are
  ``waiters`` (they are victims and their collective kernels are excused at L3); the rank with
  the shortest time in a group whose members wait is ``late`` (evidence that the cause is on
  its side, case 5). A slow link shows instead as a whole group whose shortest collective is
  long compared with the other groups on that axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus_core.detect.steps import StepMatrix
from argus_core.schema import AXES
from argus_core.stats.robust import mad_sigma, median_of_others, nanmedian, robust_z
from argus_core.taxonomy import is_comm_phase, phase_axis
from argus_core.topology import axis_groups


@dataclass(frozen=True)
class L2Config:
    """Thresholds of the phase comparison."""

    min_ratio: float = 1.25  # at least 25% slower than the group's other members
    z_threshold: float = 4.0  # robust z (median / MAD scale)
    min_group: int = 3  # an outlier needs at least two others to stand out from
    scale_floor: float = 0.02  # MAD scale never below 2% of the median (identical peers)
    waiter_share: float = 0.5  # a waiter spends at least half its collective waiting
    pair_ratio: float = 1.5  # groups of two: this much slower than the partner, who waits


@dataclass(frozen=True)
class PhaseFinding:
    """A rank slower than its peers in one phase."""

    rank: int
    phase: str
    axis: str
    ratio: float
    z: float
    kind: str  # compute or communication


@dataclass(frozen=True)
class CollectiveRole:
    """How a rank spends one collective: waiting for a late peer, or arriving late itself."""

    rank: int
    phase: str
    role: str  # waiter or late
    share: float  # waiter: share of the collective spent waiting; late: time / peers' median
    peers: tuple[int, ...]  # waiter: the late ranks it waits for; late: the ranks waiting


@dataclass
class L2Result:
    """Findings plus who waits for whom."""

    findings: list[PhaseFinding] = field(default_factory=list)
    roles: list[CollectiveRole] = field(default_factory=list)
    values: np.ndarray | None = None  # (ranks x phases) steady medians
    ratios: np.ndarray | None = None  # (ranks x phases) vs group peers, max over axes
    wait_s: dict[int, float] = field(default_factory=dict)  # per rank: waiting per step


def _groups_by_size(gid: np.ndarray) -> list[np.ndarray]:
    """Member index matrices (groups x size), one per distinct group size."""
    order = np.argsort(gid, kind="stable")
    sizes = np.bincount(gid)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    out = []
    for size in np.unique(sizes[sizes > 0]).tolist():
        groups = np.flatnonzero(sizes == size)
        out.append(order[starts[groups][:, None] + np.arange(size)])
    return out


def detect_l2(matrix: StepMatrix, coords: np.ndarray, steady: np.ndarray,
              config: L2Config | None = None) -> L2Result:
    """Compare every rank's phases with its X-group peers on every axis of size > 1."""
    config = config or L2Config()
    values = nanmedian(matrix.phases[:, steady, :], axis=1)  # ranks x phases
    names = matrix.phase_names
    compute = np.array([not is_comm_phase(n) for n in names], dtype=bool)
    best: dict[tuple[int, str], PhaseFinding] = {}
    ratios = np.full(values.shape, np.nan)
    roles: list[CollectiveRole] = []
    wait = np.zeros(len(matrix.ranks))
    for a, axis in enumerate(AXES):
        if len(np.unique(coords[:, a])) < 2:
            continue
        gid = axis_groups(coords, axis)
        comm_cols = [i for i, n in enumerate(names) if phase_axis(n) == axis]
        for members in _groups_by_size(gid):
            vals = values[members]  # groups x size x phases
            axis_roles = []
            for col in comm_cols:
                axis_roles += _collective_roles(matrix.ranks, members, vals[:, :, col],
                                                names[col], config)
                wait[members] += _mean_wait(matrix.phases[:, steady, col][members])
            roles += axis_roles
            if members.shape[1] >= config.min_group:
                _compare_compute(matrix, members, vals, compute, axis, config, best, ratios)
            elif members.shape[1] == 2:
                late = {r.rank for r in axis_roles if r.role == "late"}
                _compare_pairs(matrix, members, vals, compute, axis, config, best, late)
        for col in (i for i, n in enumerate(names) if phase_axis(n) == axis):
            _compare_links(matrix.ranks, gid, values[:, col], names[col], axis, config, best)
    findings = sorted(best.values(), key=lambda f: (f.rank, -f.z))
    wait_s = {int(r): float(w) for r, w in zip(matrix.ranks, wait, strict=True)}
    return L2Result(findings, roles, values, ratios, wait_s)


def _compare_compute(matrix: StepMatrix, members: np.ndarray, vals: np.ndarray,
                     compute: np.ndarray, axis: str, config: L2Config,
                     best: dict[tuple[int, str], PhaseFinding], ratios: np.ndarray) -> None:
    """Flag compute phases far above the other members of the same group."""
    moved = np.moveaxis(vals, 1, -1)  # groups x phases x size
    others = np.moveaxis(median_of_others(moved), -1, 1)
    scale = np.maximum(mad_sigma(moved, axis=-1), config.scale_floor * nanmedian(moved, -1))
    with np.errstate(all="ignore"):
        ratio = vals / others
        z = robust_z(vals, others, scale[:, None, :])
    flat = members.ravel()
    ratios[flat] = np.fmax(ratios[flat], ratio.reshape(len(flat), -1))
    hit = (ratio >= config.min_ratio) & (z >= config.z_threshold) & compute[None, None, :]
    for g, i, p in zip(*np.nonzero(hit), strict=True):
        finding = PhaseFinding(int(matrix.ranks[members[g, i]]), matrix.phase_names[p], axis,
                               float(ratio[g, i, p]), float(min(z[g, i, p], 1e6)), "compute")
        key = (finding.rank, finding.phase)
        if key not in best or best[key].z < finding.z:
            best[key] = finding


def _compare_pairs(matrix: StepMatrix, members: np.ndarray, vals: np.ndarray,
                   compute: np.ndarray, axis: str, config: L2Config,
                   best: dict[tuple[int, str], PhaseFinding], late: set[int]) -> None:
    """Groups of two: no spread to estimate, so the collective decides which one is slow.

    A rank is flagged when a compute phase is at least ``pair_ratio`` times its partner's
    and the partner waits for it in a collective of this axis. Without that confirmation a
    pair is left alone: either member could be the odd one. ``z`` is reported in units of the
    scale floor (2% of the partner's time), as for identical peers in larger groups.
    """
    with np.errstate(all="ignore"):
        ratio = vals / vals[:, ::-1, :]
    hit = (ratio >= config.pair_ratio) & compute[None, None, :]
    for g, i, p in zip(*np.nonzero(hit), strict=True):
        rank = int(matrix.ranks[members[g, i]])
        if rank not in late:
            continue
        z = (ratio[g, i, p] - 1) / config.scale_floor
        finding = PhaseFinding(rank, matrix.phase_names[p], axis, float(ratio[g, i, p]),
                               float(min(z, 1e6)), "compute")
        key = (rank, finding.phase)
        if key not in best or best[key].z < finding.z:
            best[key] = finding


def _mean_wait(times: np.ndarray) -> np.ndarray:
    """Mean per-step waiting of each member: its time minus the group's shortest that step.

    ``times`` is (groups x size x steps); the result is (groups x size) seconds per step. The
    mean (not the median) matches what a collective kernel's W1 excess adds up to.
    """
    shortest = np.nanmin(np.where(np.isnan(times), np.inf, times), axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        wait = np.nan_to_num(times - shortest, posinf=0.0)
    return wait.mean(axis=-1) if times.shape[-1] else np.zeros(times.shape[:2])


def _collective_roles(ranks: np.ndarray, members: np.ndarray, times: np.ndarray, phase: str,
                      config: L2Config) -> list[CollectiveRole]:
    """Waiters and late arrivers of one collective phase, group by group."""
    roles = []
    shortest = np.nanmin(times, axis=1, initial=np.inf, where=~np.isnan(times))
    with np.errstate(all="ignore"):
        share = (times - shortest[:, None]) / times
    waiting = np.nan_to_num(share) >= config.waiter_share
    for g in np.flatnonzero(waiting.any(axis=1)):
        late = np.flatnonzero(~waiting[g])
        late_ranks = tuple(int(ranks[members[g, i]]) for i in late)
        waiter_ranks = tuple(int(ranks[members[g, i]]) for i in np.flatnonzero(waiting[g]))
        peers_median = float(np.nanmedian(times[g][waiting[g]]))
        for i in np.flatnonzero(waiting[g]):
            roles.append(CollectiveRole(int(ranks[members[g, i]]), phase, "waiter",
                                        float(share[g, i]), late_ranks))
        for i in late:
            roles.append(CollectiveRole(int(ranks[members[g, i]]), phase, "late",
                                        float(times[g, i] / peers_median), waiter_ranks))
    return roles


def _compare_links(ranks: np.ndarray, gid: np.ndarray, times: np.ndarray, phase: str, axis: str,
                   config: L2Config, best: dict[tuple[int, str], PhaseFinding]) -> None:
    """Flag whole X-groups whose collective is slow even for its last-arriving member."""
    n_groups = int(gid.max()) + 1
    if n_groups < config.min_group:
        return
    shortest = np.full(n_groups, np.inf)
    np.minimum.at(shortest, gid, np.where(np.isnan(times), np.inf, times))
    shortest[np.isinf(shortest)] = np.nan
    others = median_of_others(shortest[None, :])[0]
    scale = max(float(mad_sigma(shortest)), config.scale_floor * float(np.nanmedian(shortest)))
    with np.errstate(all="ignore"):
        ratio = shortest / others
        z = robust_z(shortest, others, np.full(n_groups, scale))
    for g in np.flatnonzero((ratio >= config.min_ratio) & (z >= config.z_threshold)):
        for r in np.flatnonzero(gid == g):
            finding = PhaseFinding(int(ranks[r]), phase, axis, float(ratio[g]),
                                   float(min(z[g], 1e6)), "communication")
            key = (finding.rank, phase)
            if key not in best or best[key].z < finding.z:
                best[key] = finding
