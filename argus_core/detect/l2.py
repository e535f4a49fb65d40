"""L2: straggler rank and phase, parallelism-aware (paper section 6, case studies 1, 3, 5).

Ranks are compared only with the peers of their X-group on each axis X (ranks equal on every
other coordinate: they do the same work in lock-step). Along the pp axis only stages doing
alike work are compared (``stage_class``: real first and last stages also embed and compute
the loss). Collective phases are judged by their transfer time, i.e. with the waiting for a
late arriver removed (``argus_core.detect.arrival``): a long collective is the link only when
nobody arrived late.

Exactly what a rank is flagged on (the recording rules reproduce this):

1. Per judged step t (after warm-up, not an L1 spike), rank r and phase p:
   ``x = ln(time) - ln(median time of r's X-group at t)``; groups of two use the partner's
   time instead of the median. Times below 1 us count as 1 us.
2. Per rank and phase: ``s = median of x`` over the judged steps, or over the steps from the
   rank's own onset on when x shifts upwards significantly (a CUSUM split, in units of the
   series' step-to-step noise, never below the median noise of the series compared with it,
   that exceeds the family-wise z for every series and split point): a straggler that starts
   late is judged on its slow steps, whatever L1 saw.
3. Spread: ``sigma = max(1.4826 * MAD(s), sqrt(scale_floor^2 + se^2))``. The MAD is pooled
   over every rank compared on this axis and phase (the healthy majority calibrates it; used
   from ``min_pool`` ranks on, pairs and groups pooled separately); ``se`` is the standard
   error of the rank's own median (1.2533 x the step-to-step noise of x / sqrt(steps), the
   noise widened by Student's t for steps - 1 degrees of freedom at the family-wise level,
   since it is estimated from those few steps, and by ``drift_factor``: how much more the
   medians of 5-step batches vary than independent steps would, pooled over the rows: real
   ranks drift for a few steps), and ``scale_floor`` the rank-to-rank spread
   assumed when too few ranks show it (counted twice for a pair: two ranks differ;
   ``host_scale_floor`` for phases timed on the host clock, ``L2Config.on_clock``).
4. Flag when ``exp(s) >= min_ratio`` and ``s / sigma >= z_family``, where
   ``z_family = max(z_threshold, Phi^-1(1 - alpha / N))`` and N is the number of statistics
   judged in the job (every rank x phase x axis, plus every group below): Bonferroni, so the
   expected number of falsely flagged ranks per job stays below ``alpha`` whatever the job's
   size. (A single "step" of per-rank medians, as a metrics snapshot gives, has no step noise
   of its own: its spread is the pooled MAD and ``scale_floor`` only.)
   A rank of a pair must also be confirmed by its partner waiting for it: the partner's slack
   (waiting in collectives plus time in no phase) exceeds the rank's by at least half of the
   rank's excess in the phase. Otherwise either member could be the odd one.
   A rank's collective transfer is flagged only when its excess exceeds its waiting in
   that collective (medians over the judged steps): the transfer is what is left once the
   waiting for a late peer is taken out, the split is only as good as the arrival estimate
   (uncertain by a share of the waiting), and in a collective whose members finish together
   (all-reduce, all-gather, reduce-scatter) the waiting is all their times differ by. A
   rank that waited longer than its excess is explained by the late peer, not the link.
5. Whole groups (a slow link shared by the group): per collective phase, the group's median
   log transfer time per step minus the median over the axis's groups; same median over
   steps, pooled MAD, floor, ratio and z_family. Every member gets the finding, unless a
   member is flagged on its own in that phase (its slow members raise the group's median:
   the rest of the group is not slow).

Waiters (at least ``waiter_share`` of their collective spent waiting, median over steps) and
the late ranks they wait for are reported as roles: the evidence that a slow compute phase,
not the network, is the cause (case 5).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.stats import chi2

from argus_core.detect.arrival import CollectiveTimes, collective_times
from argus_core.detect.steps import StepMatrix
from argus_core.schema import AXES
from argus_core.stats.changepoint import row_noise, upward_shifts
from argus_core.stats.grouping import dense_ids
from argus_core.stats.robust import family_z, mad_sigma, nanmedian, t_widening
from argus_core.taxonomy import is_comm_phase, is_point_to_point, phase_axis
from argus_core.topology import axis_groups

MIN_SECONDS = 1e-6  # phase times below 1 us are measurement noise


@dataclass(frozen=True)
class L2Config:
    """Thresholds of the phase comparison (defaults are the documented ones)."""

    min_ratio: float = 1.1  # at least 10% slower than the group's median
    alpha: float = 0.002  # expected falsely flagged statistics per job (family-wise)
    z_threshold: float = 4.0  # never flag below this z; z_family is higher in larger jobs
    scale_floor: float = 0.02  # rank-to-rank spread of ln(time) assumed at least 2%
    host_scale_floor: float = 0.1  # the same on the host clock (see ``on_clock``)
    waiter_share: float = 0.5  # a waiter spends at least half its collective waiting
    min_pool: int = 8  # statistics needed before their pooled MAD is trusted
    onset_min_steps: int = 3  # steps on each side of a per-rank onset
    compare_unlike_stages: bool = False  # pp axis: compare stages whose work differs

    def on_clock(self, device: bool) -> L2Config:
        """The thresholds for phases timed on a device (CUDA events) or on the host clock.

        A phase timed on the host clock (a CPU job, or a GPU job recorded without device
        times) includes the share of its cores the scheduler gave the rank: ranks of healthy
        real jobs on shared cores differ by up to 30% in a phase for a whole run, at step noise
        small enough to make that significant. Their rank-to-rank spread is taken as at least
        ``host_scale_floor``; injected faults are 2x and more."""
        if device or self.host_scale_floor <= self.scale_floor:
            return self
        return replace(self, scale_floor=self.host_scale_floor)


@dataclass(frozen=True)
class PhaseFinding:
    """A rank slower than its peers in one phase."""

    rank: int
    phase: str
    axis: str
    ratio: float
    z: float
    kind: str  # compute or communication
    onset: int | None = None  # first step of the slowdown when it started mid-run
    excess_s: float = float("nan")  # seconds a step above its peers (time x (1 - 1/ratio))
    group: bool = False  # a whole group's collective against the axis's other groups


@dataclass(frozen=True)
class CollectiveRole:
    """How a rank spends one collective: waiting for a late peer, or arriving late itself."""

    rank: int
    phase: str
    role: str  # waiter or late
    share: float  # waiter: share of the collective spent waiting; late: time / waiters' median
    peers: tuple[int, ...]  # waiter: the late ranks it waits for; late: the ranks waiting


@dataclass(frozen=True)
class GroupStatistics:
    """What one axis's compute comparison judged its groups of three or more against (one
    entry per group size): the groups' medians, the pooled spread and each group's threshold,
    so that a metrics consumer (the scorer) publishes the core's numbers instead of
    recomputing them. For a snapshot (one "step" of medians) a member is flagged exactly when
    its time reaches its group's ``threshold``; over many steps each member's own noise widens
    its spread, and the threshold is the one of the pooled spread alone."""

    axis: str
    cols: np.ndarray  # phase columns compared (compute phases)
    members: np.ndarray  # groups x size: matrix rows of each group's members
    median: np.ndarray  # groups x cols: the group's median time (s), median over judged steps
    scale: np.ndarray  # cols: pooled spread of ln(time / group median), at least scale_floor
    threshold: np.ndarray  # groups x cols: median x exp(max(ln(min_ratio), z_family x scale))


@dataclass
class L2Result:
    """Findings plus who waits for whom."""

    findings: list[PhaseFinding] = field(default_factory=list)
    roles: list[CollectiveRole] = field(default_factory=list)
    values: np.ndarray | None = None  # (ranks x phases) steady medians
    ratios: np.ndarray | None = None  # (ranks x phases) vs group peers, max over axes
    wait_s: dict[int, float] = field(default_factory=dict)  # per rank: waiting per step
    tests: int = 0  # statistics judged (the family-wise correction's N)
    z_family: float = float("nan")
    groups: list[GroupStatistics] = field(default_factory=list)  # compute, groups of 3+


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


@dataclass
class _Stats:
    """Statistics of one comparison (one axis, one kind), one row per (rank, phase) tested."""

    axis: str
    kind: str
    rank: np.ndarray  # matrix row of the rank
    col: np.ndarray  # phase column
    s: np.ndarray  # median log ratio
    sigma: np.ndarray  # pooled spread
    onset: np.ndarray  # onset step, -1 for none
    confirmed: np.ndarray  # pairs: the partner waits for it; others: True
    tests: int = 0  # independent statistics (a group's counts once, not per member)
    members: np.ndarray | None = None  # groups of 3+: groups x size (matrix rows)
    group_log: np.ndarray | None = None  # groups of 3+: groups x cols, median ln time
    pooled: dict[int, float] = field(default_factory=dict)  # column -> pooled MAD sigma

    def __post_init__(self) -> None:
        if not self.tests:
            self.tests = int(np.isfinite(self.s).sum())


@dataclass(frozen=True)
class WindowNoise:
    """What a matrix of one "step" of window medians cannot show by itself: the step-to-step
    noise of each rank's ln(phase time) within the window (ranks x phases, NaN unknown) and
    the steps the window holds, from which each median's standard error follows."""

    sigma: np.ndarray
    steps: int


def detect_l2(matrix: StepMatrix, coords: np.ndarray, steady: np.ndarray,
              config: L2Config | None = None, times: CollectiveTimes | None = None,
              stage_class: np.ndarray | None = None,
              window_noise: WindowNoise | None = None) -> L2Result:
    """Compare every rank's phases with its X-group peers on every axis of size > 1.

    ``steady`` marks the judged steps; ``stage_class[r]`` (optional) says which pipeline
    stages do alike work: ranks of different classes are not compared along pp.
    ``window_noise``: the matrix holds one "step" of window medians (a metrics snapshot), and
    each rank's median is judged with the standard error its window's noise gives.
    """
    config = config or L2Config()
    times = times if times is not None else collective_times(matrix, coords)
    names = matrix.phase_names
    comm = np.array([is_comm_phase(n) for n in names], dtype=bool)
    result = L2Result(values=nanmedian(matrix.phases[:, steady, :], axis=1),
                      ratios=np.full((len(matrix.ranks), len(names)), np.nan))
    if not steady.any() or len(matrix.ranks) < 2:
        return result
    log_t = np.log(np.maximum(times.transfer[:, steady, :], MIN_SECONDS))  # NaN stays NaN
    slack = times.slack_s[:, steady]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a phase never recorded
        waited = np.nan_to_num(nanmedian(times.wait[:, steady, :], axis=1))
    active = [a for i, a in enumerate(AXES) if len(np.unique(coords[:, i])) > 1]
    n_series = max(len(matrix.ranks) * len(names) * len(active), 1)
    onset_z = family_z(n_series * int(steady.sum()), config.alpha)
    p_family = config.alpha / n_series
    stats: list[_Stats] = []
    for axis in active:
        gid = axis_groups(coords, axis)
        if axis == "pp" and stage_class is not None and not config.compare_unlike_stages:
            gid, _ = dense_ids(gid, np.asarray(stage_class, dtype=np.int64))
        compute_cols = np.flatnonzero(~comm)
        own_cols = np.array([i for i, n in enumerate(names) if phase_axis(n) == axis
                             and not is_point_to_point(n)], dtype=np.int64)
        if len(compute_cols):
            stats += _rank_stats(log_t, slack, matrix, gid, compute_cols, axis, "compute",
                                 config, onset_z, p_family, window_noise=window_noise)
        if len(own_cols):
            stats += _rank_stats(log_t, slack, matrix, gid, own_cols, axis, "communication",
                                 config, onset_z, p_family, pairs=False, waited=waited,
                                 window_noise=window_noise)
            stats += _group_stats(log_t, axis_groups(coords, axis), own_cols, axis, config,
                                  onset_z, p_family)
    tests = sum(st.tests for st in stats)
    z_family = max(config.z_threshold, family_z(tests, config.alpha))
    result.tests, result.z_family = tests, z_family
    result.groups = [_group_statistics(st, config, z_family) for st in stats
                     if st.kind == "compute" and st.members is not None]
    judged_steps = matrix.steps[steady]
    own_time = nanmedian(times.transfer[:, steady, :], axis=1)  # ranks x phases
    best: dict[tuple[int, str], PhaseFinding] = {}
    for st in stats:
        with np.errstate(all="ignore"):
            z = st.s / st.sigma
            ratio = np.exp(st.s)
        if st.kind != "link":
            np.fmax.at(result.ratios, (st.rank, st.col), ratio)
        hit = (ratio >= config.min_ratio) & (z >= z_family) & st.confirmed
        for i in np.flatnonzero(hit):
            onset = int(judged_steps[st.onset[i]]) if st.onset[i] >= 0 else None
            excess = float(own_time[st.rank[i], st.col[i]] * (1 - 1 / ratio[i]))
            finding = PhaseFinding(int(matrix.ranks[st.rank[i]]), names[st.col[i]], st.axis,
                                   float(ratio[i]), float(min(z[i], 1e6)),
                                   "communication" if st.kind == "link" else st.kind, onset,
                                   excess, st.kind == "link")
            key = (finding.rank, finding.phase)
            if key not in best or best[key].z < finding.z:
                best[key] = finding
    result.findings = sorted(_explained_groups_dropped(best.values(), matrix, coords),
                             key=lambda f: (f.rank, -f.z))
    result.roles = _roles(matrix, coords, times, steady, config)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank without steady steps
        waits = np.nanmean(np.where(np.isnan(matrix.wall[:, steady]), np.nan,
                                    times.wait_s[:, steady]), axis=1)
    result.wait_s = {int(r): float(np.nan_to_num(w)) for r, w in
                     zip(matrix.ranks, waits, strict=True)}
    return result


def _group_statistics(st: _Stats, config: L2Config, z_family: float) -> GroupStatistics:
    """The published form of one comparison's groups (see ``GroupStatistics``)."""
    cols = np.unique(st.col)
    scale = np.array([max(config.scale_floor, st.pooled.get(int(c), 0.0)) for c in cols])
    margin = np.maximum(np.log(config.min_ratio), z_family * scale)
    return GroupStatistics(st.axis, cols, st.members, np.exp(st.group_log),
                           scale, np.exp(st.group_log + margin[None, :]))


def _series_stats(x: np.ndarray, config: L2Config, onset_z: float, p_family: float,
                  known: tuple[np.ndarray, int] | None = None,
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median of each row, onset index or -1, own floor of the spread) for (rows x steps)
    log ratios with NaN. The floor is sqrt(scale_floor^2 + se^2), se the standard error of
    the row's median from its step-to-step noise: read off the steps, or for one or two
    values (a snapshot of medians) ``known`` (each row's noise, the steps behind it)."""
    valid = ~np.isnan(x)
    median = nanmedian(x, axis=1)
    filled = np.where(valid, x, np.nan_to_num(median)[:, None])
    noise = row_noise(filled, floor=config.scale_floor / 4)
    if len(noise) >= config.min_pool:  # a few steps misjudge one row's noise: pool them
        noise = np.maximum(noise, np.median(noise))
    noise = noise * np.sqrt(drift_factor(filled, noise))  # the noise of medians and means
    onset, stat = upward_shifts(filled, config.onset_min_steps, noise)
    shifted = stat >= onset_z
    later = np.arange(x.shape[1])[None, :] >= np.where(shifted, onset, 0)[:, None]
    used = np.maximum((later & valid).sum(axis=1), 2)
    if x.shape[1] >= 3:  # the noise comes from the series itself: widen it by Student's t
        se = 1.2533 * noise * t_widening(used - 1, p_family) / np.sqrt(used)
    elif known is not None:  # window medians: the noise their windows showed
        sigma, steps = known
        se = np.nan_to_num(1.2533 * sigma * t_widening(np.full(len(x), max(steps - 1, 1)),
                                                       p_family) / np.sqrt(max(steps, 1)))
    else:  # one or two values without their windows' noise
        se = np.zeros(len(x))
    floor = np.sqrt(config.scale_floor ** 2 + se ** 2)
    if not shifted.any():
        return median, np.full(len(x), -1), floor
    after = nanmedian(np.where(later & valid, x, np.nan), axis=1)
    shifted &= np.isfinite(after)
    return np.where(shifted, after, median), np.where(shifted, onset, -1), floor


DRIFT_BATCH = 5  # steps per batch when reading how much ranks drift


def drift_factor(x: np.ndarray, noise: np.ndarray, batch: int = DRIFT_BATCH) -> float:
    """How much more a median over steps varies than step-to-step noise says, pooled over the
    rows of (rows x steps) ``x`` (1 when the steps are independent, never below).

    Real ranks drift for a few steps (the scheduler, a busy core, thermals): consecutive
    steps are alike, so the step-to-step noise understates how far a rank's median wanders.
    The medians of consecutive batches of ``batch`` steps show it: their variance over what
    independent steps give (pi/2 noise^2 / batch), median over the rows (the healthy majority
    calibrates it; one row's real shift does not), over the median of that ratio for
    independent steps."""
    rows, n = x.shape
    batches = n // batch
    if batches < 3 or rows == 0:
        return 1.0
    medians = np.median(x[:, :batches * batch].reshape(rows, batches, batch), axis=2)
    with np.errstate(all="ignore"):
        ratio = np.var(medians, axis=1, ddof=1) / (np.pi / 2 * noise ** 2 / batch)
    ratio = ratio[np.isfinite(ratio)]
    if not len(ratio):
        return 1.0
    # Each row's ratio is a variance over batches - 1 degrees of freedom: its median sits at
    # the chi-square's median over its dof (0.84 for 5 batches) when nothing drifts.
    unbiased = np.median(ratio) * (batches - 1) / chi2.median(batches - 1)
    return float(max(1.0, unbiased))


def _pooled_sigma(s: np.ndarray, config: L2Config) -> float:
    """Normal-consistent MAD of the statistics around their median (0 when too few)."""
    finite = s[np.isfinite(s)]
    if len(finite) < config.min_pool:
        return 0.0
    return float(mad_sigma(finite))


def _rank_stats(log_t: np.ndarray, slack: np.ndarray, matrix: StepMatrix, gid: np.ndarray,
                cols: np.ndarray, axis: str, kind: str, config: L2Config, onset_z: float,
                p_family: float, pairs: bool = True,
                waited: np.ndarray | None = None,
                window_noise: WindowNoise | None = None) -> list[_Stats]:
    """Every member of every group against its group's median (or its partner), per phase;
    with ``waited`` (ranks x phases, seconds a step spent waiting), a statistic whose excess
    is no more than the rank's waiting is not confirmed."""
    out = []
    pooled: dict[bool, list[_Stats]] = {False: [], True: []}
    for members in _groups_by_size(gid):
        size = members.shape[1]
        if size < 2 or (size == 2 and not pairs):
            continue
        v = log_t[members][..., cols]  # groups x size x steps x cols
        ref = v[:, ::-1] if size == 2 else nanmedian(v, axis=1)[:, None]
        x = np.moveaxis(v - ref, 3, 2).reshape(-1, v.shape[2])  # (group, member, col) x steps
        known = None
        if window_noise is not None:
            known = (window_noise.sigma[members][..., cols].reshape(-1), window_noise.steps)
        s, onset, floor = _series_stats(x, config, onset_z, p_family, known)
        if size == 2:  # against the partner: two ranks' spreads
            floor = np.sqrt(floor ** 2 + config.scale_floor ** 2)
        rank = np.repeat(members.ravel(), len(cols))
        col = np.tile(cols, members.size)
        confirmed = np.ones(len(s), dtype=bool)
        if size == 2:
            confirmed = _partner_waits(matrix, members, cols, slack, log_t)
        if waited is not None:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                own = nanmedian(np.exp(log_t[rank, :, col]), axis=1)
            confirmed &= ~(own * -np.expm1(-s) <= waited[rank, col])
        stats = _Stats(axis, kind, rank, col, s, floor, onset, confirmed)
        if size >= 3:  # the groups' medians, for publishing (GroupStatistics)
            stats.members = members
            stats.group_log = nanmedian(ref[:, 0], axis=1)
        pooled[size == 2].append(stats)
        out.append(stats)
    for group in pooled.values():
        for c in cols.tolist():
            s_all = np.concatenate([st.s[st.col == c] for st in group]) if group else np.zeros(0)
            sigma = _pooled_sigma(s_all, config)
            for st in group:
                mine = st.col == c
                st.sigma[mine] = np.maximum(st.sigma[mine], sigma)
                st.pooled[c] = sigma
    return out


def _partner_waits(matrix: StepMatrix, members: np.ndarray, cols: np.ndarray,
                   slack: np.ndarray, log_t: np.ndarray) -> np.ndarray:
    """Pairs: whether each (member, phase)'s partner waits for it (flattened like x's rows).

    The partner's slack must exceed the member's by half of the member's excess in the phase
    (medians over the judged steps).
    """
    t = np.exp(log_t[members][..., cols])  # pairs x 2 x steps x cols
    excess = nanmedian(t - t[:, ::-1], axis=2)  # pairs x 2 x cols
    s = slack[members]  # pairs x 2 x steps
    partner_extra = nanmedian(s[:, ::-1] - s, axis=2)  # pairs x 2
    ok = partner_extra[:, :, None] >= 0.5 * excess
    return ok.reshape(-1)


def _group_stats(log_t: np.ndarray, gid: np.ndarray, cols: np.ndarray, axis: str,
                 config: L2Config, onset_z: float, p_family: float) -> list[_Stats]:
    """Whole groups whose collective transfer is slow against the axis's other groups."""
    n_groups = int(gid.max()) + 1
    if n_groups < 3:
        return []
    out = []
    for c in cols.tolist():
        per_group = np.full((n_groups, log_t.shape[1]), np.nan)
        for members in _groups_by_size(gid):
            per_group[gid[members[:, 0]]] = nanmedian(log_t[members][..., c], axis=1)
        y = per_group - nanmedian(per_group, axis=0)[None, :]
        s, onset, floor = _series_stats(y, config, onset_z, p_family)
        sigma = np.maximum(floor, _pooled_sigma(s, config))
        # One statistic per group, expanded to its members for the findings.
        rank = np.argsort(gid, kind="stable")
        g = gid[rank]
        out.append(_Stats(axis, "link", rank, np.full(len(rank), c), s[g], sigma[g], onset[g],
                          np.ones(len(rank), dtype=bool), tests=int(np.isfinite(s).sum())))
    return out


def _explained_groups_dropped(findings, matrix: StepMatrix,
                              coords: np.ndarray) -> list[PhaseFinding]:
    """Findings without the whole-group ones whose group has a member flagged on its own in
    the same phase: its slow members raise the group's median, the rest of it is not slow."""
    findings = list(findings)
    row = {int(r): i for i, r in enumerate(matrix.ranks.tolist())}
    gids = {axis: axis_groups(coords, axis) for axis in {f.axis for f in findings if f.group}}
    alone = {(f.axis, f.phase, int(gids[f.axis][row[f.rank]])) for f in findings
             if not f.group and f.axis in gids}
    return [f for f in findings if not f.group
            or (f.axis, f.phase, int(gids[f.axis][row[f.rank]])) not in alone]


def wait_share(matrix: StepMatrix, times: CollectiveTimes, steady: np.ndarray) -> np.ndarray:
    """Ranks x phases: the share of each phase spent waiting for a late peer, median over
    the judged steps (0 for compute phases, NaN where never recorded)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a phase never recorded
        return nanmedian(times.wait[:, steady, :] / matrix.phases[:, steady, :], axis=1)


def _roles(matrix: StepMatrix, coords: np.ndarray, times: CollectiveTimes, steady: np.ndarray,
           config: L2Config) -> list[CollectiveRole]:
    """Waiters and the late arrivers they wait for, per collective phase and group."""
    roles = []
    shares = wait_share(matrix, times, steady)
    for col, name in enumerate(matrix.phase_names):
        axis = phase_axis(name)
        if axis is None or axis not in AXES:
            continue
        gid = axis_groups(coords, axis)
        share = shares[:, col]
        median_time = nanmedian(matrix.phases[:, steady, col], axis=1)
        for members in _groups_by_size(gid):
            if members.shape[1] < 2:
                continue
            waiting = np.nan_to_num(share[members]) >= config.waiter_share
            for g in np.flatnonzero(waiting.any(axis=1) & ~waiting.all(axis=1)):
                row = members[g]
                late = row[~waiting[g]]
                waiters = row[waiting[g]]
                late_ranks = tuple(int(matrix.ranks[i]) for i in late)
                waiter_ranks = tuple(int(matrix.ranks[i]) for i in waiters)
                waiters_time = float(np.nanmedian(median_time[waiters]))
                roles += [CollectiveRole(int(matrix.ranks[i]), name, "waiter", float(share[i]),
                                         late_ranks) for i in waiters]
                roles += [CollectiveRole(int(matrix.ranks[i]), name, "late",
                                         float(median_time[i] / waiters_time), waiter_ranks)
                          for i in late]
    return roles
