"""The scorer's one dependency on the core's detection (argus_core.detect), in one module.

``judge`` turns a job's snapshot into what the scorer publishes, with the core's own code:

- L2: ``detect_l2`` on the phase medians as one "step" (how the core judges a metrics
  snapshot: the spread is the pooled MAD and the scale floor, the host clock's where the
  ranks' exporters time phases on it, the threshold the family-wise z over every statistic
  of the job). Collective phases are judged on their transfer time, the waiting for the last
  arriver removed (``collective_times``: a rank's arrival at a
  collective is the time of the phases before it, in step order, plus its time in no phase,
  wall - phases, beyond what most of its group spends there). Pipeline stages are compared
  only where alike (``stage_classes``: the kernels each stage runs per step, read off the
  summaries' executions).
- Every L2 finding worth a page is published (``Judgement.phases``, ``L2_FINDINGS_ALL``):
  one whose excess costs the job at least the verdicts' floor (``min_cost_share`` of the
  slowest rank's median step; ``worth_a_page``), so a collective of microseconds 1.2x its
  peers' never pages. The recording rules only rename the scorer's results, so the core is
  the single source of L2. With
  ``L2_FINDINGS_BEYOND_PROMQL`` (rules with ``l2_source: promql``) only the findings PromQL
  cannot make: pairs (decided by who waits), the pp axis (stage likeness) and every
  collective comparison (arrival skew); the rules make the others.
- The statistics the core judged with (``Judgement.groups``, ``scales``, ``z_family``,
  ``l2_tests``): each axis group's median and threshold per compute phase, the pooled spread
  per axis and phase, the family-wise z and N, taken from the core's ``L2Result.groups``,
  never recomputed.
- L3: ``score_kernels`` (peers: the ranks at the same ``peer_axis`` position; steps per
  window from the ranks' step rates); a collective kernel is excused when the rank's
  arrival-skew waiting per step explains at least half of its extra time.
- Verdicts: ``build_verdicts`` over every L2 finding and the L3 findings (no L1: the scorer
  sees no step series); a compute verdict that the rank's wait for a CPU explains (its window
  median beyond the other ranks', ``extra_window_cpu_wait``) is host, as ``argus diagnose``
  calls it from the step records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from argus_core.schema import AXES
from argus_core.score.snapshot import JobSnapshot, PhaseTable
from argus_exporters.config import Settings

if TYPE_CHECKING:
    from argus_core.detect.attribution import Suspect

PROMQL_AXES = ("dp", "tp", "ep")
"""Axes whose compute-phase comparisons (groups of three or more) the recording rules make
with ``l2_source: promql``; the scorer publishes the rest. The pipeline axis is the
scorer's: which stages do alike work is read off the kernels the processors see; so are
pairs (who waits) and collectives (arrival skew)."""
WINDOW_STEPS = Settings.window_steps
"""Steps in the exporters' rolling windows (their ARGUS_WINDOW_STEPS default)."""


@dataclass
class KernelScoresTable:
    """Per (rank, kernel, stream): the W1 score and whether it is a finding (columns)."""

    rank: np.ndarray
    kernel: np.ndarray  # index into names
    stream: np.ndarray
    score: np.ndarray
    straggler: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return len(self.rank)


def _empty() -> KernelScoresTable:
    return KernelScoresTable(*(np.zeros(0, dtype=np.int64),) * 3, np.zeros(0),
                             np.zeros(0, dtype=bool), [])


@dataclass(frozen=True)
class PhaseStraggler:
    """An L2 finding the scorer publishes, with the rank's identity labels."""

    rank: int
    phase: str
    axis: str
    kind: str  # compute or communication
    ratio: float
    labels: dict[str, str]  # host and coordinates


L2_FINDINGS_ALL = "all"
L2_FINDINGS_BEYOND_PROMQL = "beyond-promql"
L2_FINDINGS = (L2_FINDINGS_ALL, L2_FINDINGS_BEYOND_PROMQL)


@dataclass(frozen=True)
class GroupRow:
    """One axis group's statistics in one compute phase, with its identifying labels."""

    axis: str
    phase: str
    labels: dict[str, str]  # the group's coordinates on every other axis
    median: float  # seconds
    threshold: float  # seconds: a member at or above it is a finding


@dataclass
class Judgement:
    """What the scorer publishes for one job."""

    kernels: KernelScoresTable = field(default_factory=_empty)
    verdicts: list[tuple[int, str]] = field(default_factory=list)  # (rank, cause)
    wait_s: dict[int, float] = field(default_factory=dict)  # per rank, per step
    unscored: set[int] = field(default_factory=set)  # known ranks with no score at all
    phases: list[PhaseStraggler] = field(default_factory=list)  # L2 findings published
    l2_tests: int = 0  # statistics the core's L2 judged (its family-wise N)
    z_family: float = float("nan")  # the z every L2 statistic of the job must reach
    groups: list[GroupRow] = field(default_factory=list)  # groups of 3+, compute phases
    scales: list[tuple[str, str, float]] = field(default_factory=list)  # (axis, phase, scale)
    peer_sets: list[int] | None = None  # positions on the peer axis judged (None: all)
    lead: bool = True  # publishes the job-wide L2 statistics (one shard of a job does)
    suspects: list[Suspect] = field(default_factory=list)  # hardware units the verdicts share
    short_of_cpu: dict[int, float] = field(default_factory=dict)  # rank -> seconds a step it
    # waited for a CPU beyond its peers, for the ranks whose slowdown that explains


def judge(snapshot: JobSnapshot, peer_axis: str = "pp",
          l2_findings: str = L2_FINDINGS_ALL,
          promql_axes: tuple[str, ...] = PROMQL_AXES) -> Judgement:
    """Judge one job with the core: L2 on the phase medians (waiting from arrival skew),
    L3 on the kernel summaries (waiting excused), and verdicts. ``l2_findings`` says which
    L2 findings are published: all, or those beyond the ``promql`` rules' comparisons (on
    ``promql_axes``, the rules' ``axes``)."""
    if l2_findings not in L2_FINDINGS:
        raise ValueError(f"l2_findings {l2_findings!r}: expected one of {', '.join(L2_FINDINGS)}")
    from argus_core.detect.attribution import attribute
    from argus_core.detect.cpu_wait import extra_window_cpu_wait
    from argus_core.detect.diagnose import DiagnoseConfig
    from argus_core.detect.l1 import L1Result
    from argus_core.detect.l2 import L2Result
    from argus_core.detect.verdict import build_verdicts

    config = DiagnoseConfig()
    out = Judgement()
    l2 = L2Result()
    if snapshot.phases is not None:
        l2 = judge_phases(snapshot.phases, config.l2.on_clock(not snapshot.host_clock),
                          stage_classes(snapshot, snapshot.phases))
        out.wait_s, out.l2_tests, out.z_family = l2.wait_s, l2.tests, l2.z_family
        published = (all_findings(l2, snapshot.phases) if l2_findings == L2_FINDINGS_ALL
                     else beyond_promql(l2, snapshot.phases, promql_axes))
        context = _context(snapshot)
        worth = {(f.rank, f.phase) for f in l2.findings
                 if worth_a_page(f.excess_s, context, config.verdict.min_cost_share)}
        out.phases = [f for f in published if (f.rank, f.phase) in worth]
        out.groups, out.scales = group_rows(l2, snapshot.phases)
    findings = _score_kernels(snapshot, peer_axis, config.l3, out)
    out.unscored = snapshot.known_ranks - set(np.unique(out.kernels.rank).tolist())
    empty = np.zeros(0)
    no_l1 = L1Result(empty.astype(np.int64), empty, empty, empty.astype(bool))
    waits = snapshot.cpu_wait
    verdicts = build_verdicts(no_l1, l2, findings, context=_context(snapshot),
                              cpu_wait=lambda rank, onset: extra_window_cpu_wait(waits, rank))
    out.verdicts = [(v.rank, v.cause) for v in verdicts]
    out.short_of_cpu = {v.rank: v.cpu_wait_s for v in verdicts if v.cpu_wait_s is not None}
    out.suspects = attribute(snapshot.identities, out.verdicts, snapshot.known_ranks,
                             {v.rank: v.cost.seconds for v in verdicts if v.cost is not None})
    return out


def restrict(judgement: Judgement, snapshot: JobSnapshot, peer_axis: str,
             lead: bool) -> Judgement:
    """What one scorer shard publishes of a job it judged with only some peer sets'
    summaries (``snapshot.peer_sets``; the phase medians of every rank): the kernel scores,
    verdicts, waits, L2 findings and unscored ranks of the ranks in those peer sets (a rank
    without an identity is in peer set 0, as the core scores it), and the job-wide L2
    statistics only where ``lead``. The shards of a job together publish what one scorer
    would."""
    if snapshot.peer_sets is None:
        return judgement
    axis = AXES.index(peer_axis)
    owned = set(snapshot.peer_sets)

    def mine(rank: int) -> bool:
        coords = snapshot.coords.get(rank)
        return (coords[axis] if coords is not None else 0) in owned

    return Judgement(
        kernels=judgement.kernels,  # only the owned peer sets' summaries were scored
        verdicts=[(r, c) for r, c in judgement.verdicts if mine(r)],
        wait_s={r: w for r, w in judgement.wait_s.items() if mine(r)},
        unscored={r for r in judgement.unscored if mine(r)},
        phases=[f for f in judgement.phases if mine(f.rank)],
        l2_tests=judgement.l2_tests if lead else 0,
        z_family=judgement.z_family if lead else float("nan"),
        groups=judgement.groups if lead else [], scales=judgement.scales if lead else [],
        peer_sets=sorted(owned), lead=lead, suspects=judgement.suspects if lead else [],
        short_of_cpu={r: s for r, s in judgement.short_of_cpu.items() if mine(r)})


def worth_a_page(excess_s: float, context, min_cost_share: float) -> bool:
    """Whether a finding's excess a step costs the job at least ``min_cost_share`` of its
    step (the verdicts' floor); without a known step time every finding is."""
    from argus_core.detect.cost import cost_of

    share = cost_of(excess_s if np.isfinite(excess_s) else 0.0, 1, context).share
    return share is None or share >= min_cost_share


def _context(snapshot: JobSnapshot):
    """What a verdict's cost is measured against: the job's step, the slowest rank's median
    step time (the ranks wait for it); none known without step times."""
    from argus_core.detect.cost import JobContext

    table = snapshot.phases
    if table is None or table.wall is None or not np.isfinite(table.wall).any():
        return JobContext()
    return JobContext(step_s=float(np.nanmax(table.wall)), world=len(table.ranks),
                      judged_steps=1)


def judge_phases(table: PhaseTable, config=None, stages: np.ndarray | None = None):
    """The core's L2 on one "step" holding each rank's phase medians (an ``L2Result``).

    Wall times are the ranks' median step times; device time is not read (its split of
    the step into host and idle time does not change who arrived last), so a rank's time in
    no phase (wall - phases) counts as its idle time before any collective. Each median is
    judged with the standard error its window's noise gives (``table.noise``, from the
    window's quartiles): a rank whose steps vary widely has a median that wanders.
    """
    from argus_core.detect.arrival import collective_times
    from argus_core.detect.l2 import WindowNoise, detect_l2
    from argus_core.detect.steps import StepMatrix

    n = len(table.ranks)
    wall = (table.wall if table.wall is not None else np.full(n, np.nan))[:, None]
    zero = np.zeros(1, dtype=np.int64)
    matrix = StepMatrix(table.ranks, zero, zero, wall.copy(), np.full((n, 1), np.nan),
                        table.values[:, None, :], list(table.names))
    times = collective_times(matrix, table.coords)
    if table.minimum is not None:
        window_waits(times, matrix, table.coords, table.minimum)
    noise = None
    if table.noise is not None:
        noise = WindowNoise(table.noise, WINDOW_STEPS)
    return detect_l2(matrix, table.coords, np.ones(1, dtype=bool), config, times, stages,
                     noise)


def window_waits(times, matrix, coords: np.ndarray, minimum: np.ndarray,
                 window_steps: int = WINDOW_STEPS) -> None:
    """Waiting and transfer of the collectives in a one-"step" matrix of window medians, with
    the bound that members of a collective finish together taken from the window's shortest
    times (``minimum``, ranks x phases) instead of the medians.

    The core bounds each step's waiting by ``d - shortest d in the group`` and by the last
    arrival; medians smooth away the step-to-step jitter of arrivals, so the shortest median
    of a group still holds the waiting its members did whenever a peer arrived after them
    (most of a collective of a few milliseconds). A rank's shortest time in the window is a
    step in which it waited for nobody: the group's shortest of them is its transfer alone,
    and no rank's transfer exceeds its own shortest. Arrivals are the core's (phases before
    the collective, plus time in no phase beyond what most of the group spends there:
    ``beyond_most``).
    """
    from argus_core.detect.arrival import beyond_most, group_reduce
    from argus_core.taxonomy import is_comm_phase, phase_axis
    from argus_core.topology import axis_groups

    phases = matrix.phases
    filled = np.nan_to_num(phases)
    a_lo = np.cumsum(filled, axis=2) - filled
    slack = np.where(np.isnan(matrix.wall), np.nan,
                     np.maximum(np.nan_to_num(matrix.wall) - filled.sum(axis=2), 0.0))
    for col, name in enumerate(matrix.phase_names):
        axis = phase_axis(name)
        if not is_comm_phase(name) or axis is None or len(matrix.ranks) < 2:
            continue
        gid = axis_groups(coords, axis)
        d = phases[:, :, col]
        low = np.fmin(d, minimum[:, None, col])  # NaN minimum: the median
        # The per-step shortest of k members is about their 1 - 0.5^(1/k) quantile; each
        # member's is read between its window minimum (quantile ~1/(n+1)) and its median.
        k = np.bincount(gid)[gid][:, None]
        share = np.clip((1 - 0.5 ** (1 / k) - 1 / (window_steps + 1))
                        / (0.5 - 1 / (window_steps + 1)), 0.0, 1.0)
        own = low + share * (d - low)
        last = group_reduce(a_lo[:, :, col] + beyond_most(slack, gid), gid, np.fmax)[gid]
        shortest = group_reduce(own, gid, np.fmin)[gid]
        with np.errstate(invalid="ignore"):
            wait = np.clip(np.minimum(d - shortest, last - a_lo[:, :, col]), 0.0, d)
            times.transfer[:, :, col] = np.minimum(d - wait, own)
        times.wait[:, :, col] = d - times.transfer[:, :, col]
    comm = np.array([is_comm_phase(n) for n in matrix.phase_names], dtype=bool)
    times.wait_s[...] = np.nansum(times.wait, axis=2)
    times.comm_s[...] = np.nansum(times.transfer[:, :, comm], axis=2)


def all_findings(l2, table: PhaseTable) -> list[PhaseStraggler]:
    """Every L2 finding of the core, with the rank's host and coordinates."""
    row = {int(r): i for i, r in enumerate(table.ranks.tolist())}
    return [PhaseStraggler(f.rank, f.phase, f.axis, f.kind, f.ratio,
                           _rank_labels(table, row[f.rank])) for f in l2.findings]


def _rank_labels(table: PhaseTable, i: int) -> dict[str, str]:
    return {"host": table.hosts[i] if table.hosts else "",
            **{a: str(int(table.coords[i, k])) for k, a in enumerate(AXES)}}


def beyond_promql(l2, table: PhaseTable,
                  axes: tuple[str, ...] = PROMQL_AXES) -> list[PhaseStraggler]:
    """The findings of comparisons the ``promql`` recording rules do not make: collectives,
    pairs, the pp axis and the axes left out of their ``axes``."""
    from argus_core.topology import axis_groups

    sizes = {}
    for axis in AXES:
        gid = axis_groups(table.coords, axis)
        sizes[axis] = np.bincount(gid)[gid]
    row = {int(r): i for i, r in enumerate(table.ranks.tolist())}
    return [f for f in all_findings(l2, table)
            if not (f.kind == "compute" and f.axis in axes
                    and sizes[f.axis][row[f.rank]] >= 3)]  # the rules' comparison


def group_rows(l2, table: PhaseTable) -> tuple[list[GroupRow], list[tuple[str, str, float]]]:
    """The core's group statistics (``L2Result.groups``) as labelled rows: per group and
    compute phase its median and threshold, labelled by the group's other coordinates; per
    axis and phase the pooled spread. A pipeline group split into unlike stages shares its
    coordinates with the other part: such groups are left out (the findings still name
    their members), so that no two rows carry the same labels."""
    rows: list[GroupRow] = []
    scales: dict[tuple[str, str], float] = {}
    seen: dict[tuple, int] = {}
    for stats in l2.groups:
        others = [(j, a) for j, a in enumerate(AXES) if a != stats.axis]
        first = table.coords[stats.members[:, 0]]
        for c, col in enumerate(stats.cols.tolist()):
            phase = table.names[col]
            scales[(stats.axis, phase)] = float(stats.scale[c])
            for g in range(len(first)):
                labels = {a: str(int(first[g, j])) for j, a in others}
                key = (stats.axis, phase, *labels.values())
                seen[key] = seen.get(key, 0) + 1
                median, threshold = float(stats.median[g, c]), float(stats.threshold[g, c])
                if np.isfinite(median):
                    rows.append(GroupRow(stats.axis, phase, labels, median, threshold))
    unique = [r for r in rows if seen[(r.axis, r.phase, *r.labels.values())] == 1]
    return unique, [(axis, phase, scale) for (axis, phase), scale in sorted(scales.items())]


def stage_classes(snapshot: JobSnapshot, table: PhaseTable) -> np.ndarray | None:
    """Class of each table rank's pipeline stage from the kernels it runs per step, as
    ``argus_core.detect.stages`` decides on a trace: a stage's inventory is the median over
    its sampled ranks (``snapshot.stage_sample``: the lowest-numbered ``STAGE_SAMPLE``) of
    each compute kernel's executions per step, rounded; stages with the same inventory are
    alike. None (all alike) without summaries or step rates. The same on a scorer shard,
    which holds the sample's summaries beside its own peer sets'."""
    from argus_core.score.snapshot import STAGE_SAMPLE, concat
    from argus_core.stats.grouping import dense_ids
    from argus_core.taxonomy import is_comm_kernel

    summary = snapshot.summary
    if snapshot.stage_sample is not None and len(snapshot.stage_sample):
        summary = concat([summary, snapshot.stage_sample],
                         {name: i for i, name in enumerate(summary.names)}, summary.window_ns)
    pp = table.coords[:, AXES.index("pp")]
    if len(np.unique(pp)) < 2 or not len(summary):
        return None
    steps = np.array([snapshot.steps_per_s.get(int(r), 0.0) for r in table.ranks.tolist()])
    steps *= summary.window_ns * 1e-9
    compute = np.array([not is_comm_kernel(n) for n in summary.names], dtype=bool)
    row = np.searchsorted(table.ranks, summary.rank)
    known = row < len(table.ranks)
    known[known] = table.ranks[row[known]] == summary.rank[known]
    keep = known & compute[summary.kernel]
    keep[keep] = steps[row[keep]] > 0
    if not keep.any():
        return None
    cell, (cell_row, cell_kernel) = dense_ids(row[keep], summary.kernel[keep])
    per_step = np.bincount(cell, summary.count[keep].astype(np.float64)) / steps[cell_row]
    n_kernels = len(summary.names)
    counts = np.zeros((len(table.ranks), n_kernels))
    counts[cell_row, cell_kernel] = per_step
    stages = np.unique(pp)
    inventory = np.stack([np.median(counts[pp == s][:STAGE_SAMPLE], axis=0) for s in stages])
    _, stage_class = np.unique(np.round(inventory).astype(np.int64), axis=0,
                               return_inverse=True)
    return stage_class.reshape(-1)[np.searchsorted(stages, pp)]


def _score_kernels(snapshot: JobSnapshot, peer_axis: str, config, out: Judgement) -> list:
    """L3 on the summaries: fills ``out.kernels``, returns the findings (waiting excused)."""
    from argus_core.detect.l3 import score_kernels
    from argus_core.detect.l3_findings import KernelFinding
    from argus_core.taxonomy import is_comm_kernel

    summary = snapshot.summary
    if not len(summary):
        return []
    top = int(summary.rank.max()) + 1
    peer = np.zeros(top, dtype=np.int64)
    axis = AXES.index(peer_axis)
    for rank, coords in snapshot.coords.items():
        if rank < top:
            peer[rank] = coords[axis]
    rates = [v for v in snapshot.steps_per_s.values() if v > 0]
    steps = (np.array([np.median(rates) * summary.window_ns * 1e-9]) if rates else None)
    scale = 1.0  # a shard's family-wise thresholds are the job's: its ranks' share of them
    if snapshot.peer_sets is not None:
        owned = set(snapshot.peer_sets)
        mine = sum(coords[axis] in owned for coords in snapshot.coords.values())
        scale = len(snapshot.coords) / max(mine, 1)
    scores = score_kernels(summary, peer, config, steps, family_scale=scale)
    keep = ~np.isnan(scores.score)  # units with too few peers: no score, nothing said
    straggler = scores.flagged & keep
    comm = np.array([is_comm_kernel(n) for n in scores.names], dtype=bool)
    for i in np.flatnonzero(straggler & comm[scores.kernel]).tolist():
        # A collective kernel is long for a rank that waits in it for a late peer: its
        # waiting per step (arrival skew) explains at least half the extra time -> excused.
        rank = int(scores.rank[i])
        per_step = snapshot.steps_per_s.get(rank, 0.0) * summary.window_ns * 1e-9
        extra_s = scores.excess_ns[i] * scores.executions[i] * 1e-9 / max(per_step, 1.0)
        straggler[i] = out.wait_s.get(rank, 0.0) < 0.5 * extra_s
    out.kernels = KernelScoresTable(scores.rank[keep], scores.kernel[keep],
                                    scores.stream[keep], scores.score[keep],
                                    straggler[keep], scores.names)
    return [KernelFinding(int(scores.rank[i]), scores.names[scores.kernel[i]],
                          int(scores.stream[i]), float(scores.score[i]),
                          bool(comm[scores.kernel[i]]))
            for i in np.flatnonzero(straggler).tolist()]
