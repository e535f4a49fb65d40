"""Verdicts: one cause per flagged rank (compute, communication or host), with evidence in words
and what it costs the job.

Compute wins over host and communication: a rank with slow compute also shows odd collectives
(short, because it arrives last), and its peers' long collectives are waiting (case 5); a cause
wins only when it costs enough (a late rank computes a little slower after sleeping, which
must not hide its host stall). A rank
is "host" when its host time exceeds its peers' step after step (``detect.host``), and
"communication" when only its collectives' transfer time is slow (waiting removed), or when a
point-to-point link it is an end of slowed down (``detect.links``: both ends of the link, each
naming the other as its ``peer``; this wins over every other cause, since a late rank never
makes both ends of one link slow). Ranks L1
attributes a regression to, or repeated spikes, get a verdict even when L2 and L3 saw nothing:
"host" when the excess sits in their host time (wall - device time) or device idle time while
their device work stayed flat (case 4, and a sustained host stall), else the part of their own
time that rose.

Every verdict needs a significant test *and* a cost worth acting on:
- its cost is how much shorter the job's step would be without the rank's excess (seconds a
  step, at most the step), its share of the job's median step, and the GPU-seconds lost over
  its range (seconds x world size x steps); a verdict costing less than ``min_cost_share`` of
  the step is no verdict, whatever its z (listed as ``minor``);
- spikes make a verdict only when they repeat: at least ``min_spikes`` spikes (each beyond the
  job's own noise, ``detect.l1``) on the rank, or more of the job's spikes and blips on it
  than chance gives (a binomial test against a uniform share of the ranks, corrected for the
  number of ranks). A one-off blip is never a verdict;
- a regression is sustained when it lasts ``min_episode_steps``, or ``min_sustained_steps``
  if it is still on at the trace's end; a shorter episode (real machines drift for a few
  steps) makes no verdict.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from argus_core.detect.cost import MIN_COST_SHARE, Cost, JobContext, cost_of, steps_from
from argus_core.detect.cpu_wait import CpuWaitConfig
from argus_core.detect.host import HostFinding
from argus_core.detect.l1 import Culprit, L1Result
from argus_core.detect.l2 import L2Result
from argus_core.detect.l3_findings import KernelFinding
from argus_core.detect.links import LinkFinding
from argus_core.schema import StackRecord


@dataclass(frozen=True)
class VerdictConfig:
    """When findings become a verdict (defaults are the documented ones)."""

    min_cost_share: float = MIN_COST_SHARE  # a verdict costs the job at least this share
    min_spikes: int = 2  # spikes beyond the job's noise on one rank before they are a verdict
    repeat_alpha: float = 0.01  # spikes and blips on one rank beyond chance (family-wise)
    min_repeats: int = 3  # ... and at least this many
    min_episode_steps: int = 20  # a regression that ends before the trace is this long
    min_sustained_steps: int = 8  # a regression still on at the trace's end is this long
    cpu_wait_share: float = CpuWaitConfig.min_share  # extra CPU wait that makes compute host


@dataclass(frozen=True)
class Verdict:
    """The most likely cause for one rank, why, and what it costs."""

    rank: int
    cause: str
    evidence: str
    cost: Cost | None = None  # None: no time measure behind the finding (kernel scores alone)
    peer: int | None = None  # the other end of the slow link, for a link's verdict
    cpu_wait_s: float | None = None  # a step's wait for a CPU beyond its peers', where it
    # made a compute slowdown host (short of CPU)


def ranks_text(ranks: Iterable[int]) -> str:
    """Ranks for a message: sorted, runs of three or more as '48-63', '0, 2 and 3', the first
    eight parts, then how many more ranks."""
    ranks = sorted(set(ranks))
    parts: list[str] = []
    counts: list[int] = []
    start = 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            if len(run) >= 3:
                parts.append(f"{run[0]}-{run[-1]}")
                counts.append(len(run))
            else:
                parts += map(str, run)
                counts += [1] * len(run)
            start = i
    if len(parts) > 8:
        return ", ".join(parts[:8]) + f" and {sum(counts[8:])} more"
    if len(parts) <= 2:
        return " and ".join(parts)
    return ", ".join(parts[:-1]) + f" and {parts[-1]}"


def build_verdicts(l1: L1Result, l2: L2Result, l3: list[KernelFinding],
                   stacks: list[StackRecord] | None = None,
                   step_starts: np.ndarray | None = None,
                   host: list[HostFinding] | None = None,
                   context: JobContext | None = None,
                   config: VerdictConfig | None = None,
                   minor: list[Verdict] | None = None,
                   links: list[LinkFinding] | None = None,
                   cpu_wait: Callable[[int, int | None], float | None] | None = None,
                   cpu_wait_rise: Callable[[int, int, int | None], float | None] | None = None,
                   ) -> list[Verdict]:
    """Combine L1 culprits, L2 findings, host findings, L3 findings and slow links into one
    verdict per rank; candidates that cost less than the floor go to ``minor`` when given.
    ``cpu_wait(rank, from_step)``: seconds a step the rank waited for a CPU beyond its peers
    (``argus_core.detect.cpu_wait``); a compute verdict it explains is a host one.
    ``cpu_wait_rise(rank, first, last)``: the rise of that wait from before an L1 regression
    over its steps, beyond the other ranks' rise, for a compute verdict that is the
    regression's culprit (slower than its own past, not than its peers)."""
    context = context or JobContext()
    config = config or VerdictConfig()
    l2_by_rank = defaultdict(list)
    for finding in l2.findings:
        l2_by_rank[finding.rank].append(finding)
    l3_by_rank = defaultdict(list)
    for finding in l3:
        l3_by_rank[finding.rank].append(finding)
    host_by_rank = {f.rank: f for f in host or []}
    late = defaultdict(list)
    for role in l2.roles:
        if role.role == "late":
            late[role.rank].append(role)
    culprits = _repeated_culprits(l1, context, config)
    job_onset = l1.regressions[-1][0] if l1.regressions else None
    links_by_rank = defaultdict(list)
    for link in links or []:  # each link worth acting on by itself
        if context.step_s and link.cost_s < config.min_cost_share * context.step_s:
            continue
        links_by_rank[link.sender].append(link)
        links_by_rank[link.receiver].append(link)

    verdicts = []
    for rank in sorted(set(l2_by_rank) | set(l3_by_rank) | set(culprits) | set(host_by_rank)
                       | set(links_by_rank)):
        phases = [f for f in l2_by_rank[rank] if f.kind == "compute"]
        links = [f for f in l2_by_rank[rank] if f.kind == "communication"]
        kernels = [f for f in l3_by_rank[rank] if not f.comm]
        collectives = [f for f in l3_by_rank[rank] if f.comm]
        own_onsets = [f.onset for f in phases if f.onset is not None]
        onset = min(own_onsets) if own_onsets else job_onset
        candidates = []  # in the order causes win: a link, compute, host, communication, L1's
        if links_by_rank[rank]:
            candidates.append(_link_verdict(rank, links_by_rank[rank], context))
        if phases or kernels:
            cost = _findings_cost(phases, onset, context)
            candidates.append(Verdict(rank, "compute", _compute_evidence(
                phases, kernels, late[rank], onset), cost))
        if rank in host_by_rank and not any(
                c.event == "regression" and c.cause == "host" for c in culprits.get(rank, [])):
            finding = host_by_rank[rank]
            cost = cost_of(finding.excess_s, context.judged_steps, context)
            candidates.append(Verdict(rank, "host", _host_evidence(finding, context), cost))
        if links or collectives:
            cost = _findings_cost(links, None, context)
            candidates.append(Verdict(rank, "communication", _link_evidence(
                links, collectives, l3), cost))
        regression = None  # the worst of L1's regressions behind the culprits' candidate
        if culprits.get(rank):
            cause = _culprit_cause(culprits[rank])
            mine = [c for c in culprits[rank] if c.cause == cause]
            cost = _culprits_cost(mine, context)
            candidates.append(Verdict(rank, _culprit_cause(mine), _culprit_evidence(
                rank, mine, l1, stacks or [], step_starts, context), cost))
            regression = max((c for c in mine if c.event == "regression"), default=None,
                             key=lambda c: c.excess_s)
        candidates = [_with_cost_text(v, context) for v in candidates]
        from_culprits = candidates[-1] if regression is not None else None
        # the first cause that costs the job enough wins; a smaller one that would have won
        # (a rank that slept computes a little slower after) is not allowed to hide it
        passing = [v for v in candidates if not _too_small(v, config)]
        chosen = passing[0] if passing else None
        host_too = [v for v in passing if v.cause == "host"]
        if chosen is not None and chosen.cause == "compute" and host_too and _cost_s(
                host_too[0]) > _cost_s(chosen):  # slow compute shows no host time, but a
            chosen = host_too[0]  # stalled rank's compute may slow a little: the larger wins
        if chosen is not None and chosen.cause == "compute":
            if chosen is from_culprits and cpu_wait_rise is not None:
                chosen = _short_of_cpu(chosen, cpu_wait_rise(
                    rank, regression.step, regression.last_step), config,
                    f"than before step {regression.step}")
            elif cpu_wait is not None:
                since = f" from step {onset}" if onset is not None else ""
                chosen = _short_of_cpu(chosen, cpu_wait(rank, onset), config,
                                       f"than its peers'{since}")
        if chosen is not None:
            verdicts.append(chosen)
        elif candidates and minor is not None:
            minor.append(candidates[0])
    return verdicts


def _short_of_cpu(verdict: Verdict, extra_wait_s: float | None, config: VerdictConfig,
                  reference: str) -> Verdict:
    """A compute verdict as host when the rank's extra wait for a CPU explains most of it
    (``reference``: what the wait is beyond, in the evidence's words)."""
    if extra_wait_s is None or verdict.cost is None or not verdict.cost.seconds > 0:
        return verdict
    if extra_wait_s < config.cpu_wait_share * verdict.cost.seconds:
        return verdict
    return Verdict(verdict.rank, "host",
                   f"short of CPU: its training thread waited {_seconds(extra_wait_s)} a step "
                   f"longer for a CPU {reference} (another process on its cores, or "
                   f"more busy threads than cores), so it is not slow at its own work; "
                   f"{verdict.evidence}", verdict.cost, verdict.peer, extra_wait_s)


def _cost_s(verdict: Verdict) -> float:
    return verdict.cost.seconds if verdict.cost is not None else 0.0


def _too_small(verdict: Verdict, config: VerdictConfig) -> bool:
    """Whether a candidate costs less than the floor (``min_cost_share`` of the step)."""
    return (verdict.cost is not None and verdict.cost.share is not None
            and verdict.cost.share < config.min_cost_share)


def _repeated_culprits(l1: L1Result, context: JobContext,
                       config: VerdictConfig) -> dict[int, list[Culprit]]:
    """Per rank, the culprits that can make a verdict: regressions, and spikes and blips that
    repeat on it (see the module doc)."""
    by_rank: dict[int, list[Culprit]] = defaultdict(list)
    for c in l1.culprits:
        by_rank[c.rank].append(c)
    events = {c.step for c in l1.culprits if c.event != "regression"}
    world = max(context.world, len(by_rank), 1)
    out = {}
    def sustained(c: Culprit) -> bool:
        if c.last_step is None or context.last_step is None:
            return True
        length = c.last_step - c.step + 1
        if c.last_step >= context.last_step:  # still on: long enough to be a level
            return length >= config.min_sustained_steps
        return length >= config.min_episode_steps

    for rank, mine in by_rank.items():
        kept = [c for c in mine if c.event == "regression" and sustained(c)]
        spikes = [c for c in mine if c.event == "spike"]
        transient = [c for c in mine if c.event != "regression"]
        beyond_chance = (world > 1 and len(transient) >= config.min_repeats and
                         binom.sf(len(transient) - 1, len(events), 1 / world)
                         <= config.repeat_alpha / world)
        if beyond_chance:
            kept += transient
        elif len(spikes) >= config.min_spikes:
            kept += spikes
        if kept:
            out[rank] = sorted(kept, key=lambda c: c.step)
    return out


def _culprit_cause(culprits: list[Culprit]) -> str:
    """The cause whose culprits cost the job the most time in all (a regression: its excess
    a step times its steps; a spike: its excess)."""
    total: Counter[str] = Counter()
    for c in culprits:
        steps = (c.last_step - c.step + 1) if c.event == "regression" and c.last_step else 1
        total[c.cause] += max(c.excess_s, 0.0) * steps
    return total.most_common(1)[0][0] if total else culprits[0].cause


def _findings_cost(findings, onset: int | None, context: JobContext) -> Cost | None:
    """The cost of a rank's L2 findings: their excess seconds a step added up."""
    if not findings:
        return None  # kernel scores alone: no seconds behind them
    seconds = sum(f.excess_s for f in findings if np.isfinite(f.excess_s))
    return cost_of(seconds, steps_from(onset, context), context)


def _culprits_cost(culprits: list[Culprit], context: JobContext) -> Cost:
    """Regressions: their excess a step over their range; spikes: their excess spread over
    the judged steps."""
    regressions = [c for c in culprits if c.event == "regression"]
    if regressions:
        worst = max(regressions, key=lambda c: c.excess_s)
        last = worst.last_step if worst.last_step is not None else context.last_step
        steps = (last - worst.step + 1) if last is not None else context.judged_steps
        return cost_of(worst.excess_s, steps, context)
    total = sum(max(c.excess_s, 0.0) for c in culprits)
    steps = max(context.judged_steps, 1)
    cost = cost_of(total / steps, steps, context)
    return cost


def _with_cost_text(verdict: Verdict, context: JobContext) -> Verdict:
    """The evidence with its cost stated (rank-seconds where no device is timed)."""
    cost = verdict.cost
    if cost is None or cost.seconds <= 0:
        return verdict
    text = f"costs the job {_seconds(cost.seconds)} a step"
    if cost.share is not None:
        text += f" ({cost.share:.1%} of its step)"
    if cost.gpu_seconds is not None:
        unit = "GPU-seconds" if context.device else "rank-seconds"
        text += f", {cost.gpu_seconds:,.1f} {unit} over {cost.steps} steps"
    return Verdict(verdict.rank, verdict.cause, f"{verdict.evidence}; {text}", cost,
                   verdict.peer)


def _seconds(value: float) -> str:
    """'18 ms', '1.2 s', '350 us'."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} us"


def _compute_evidence(phases, kernels, late_roles, onset: int | None) -> str:
    parts = [f"{f.phase} {f.ratio:.1f}x its {f.axis}-group peers (robust z {f.z:.0f})"
             for f in sorted(phases, key=lambda f: -f.ratio)]
    if kernels:
        top = sorted(kernels, key=lambda f: -f.score)[:3]
        parts.append("slow kernels: " + ", ".join(f"{k.kernel} +{k.score:.0%}" for k in top))
    text = "; ".join(parts) + (f" since step {onset}" if onset is not None else "")
    if late_roles:
        names = sorted({r.phase for r in late_roles})
        waiting = sorted({p for r in late_roles for p in r.peers})
        share = min(r.share for r in late_roles)
        verb = "takes" if len(names) == 1 else "take"
        who = f"rank {waiting[0]} waits" if len(waiting) == 1 else \
            f"ranks {ranks_text(waiting)} wait"
        text += (f". Its {', '.join(names)} {verb} {share:.2f}x the time of its peers' "
                 f"({who} for it there): it arrives late, so the network is not the cause")
    return text


def _link_verdict(rank: int, links: list[LinkFinding], context: JobContext) -> Verdict:
    """A rank at an end of slow links: communication, naming the costliest link's other end."""
    worst = max(links, key=lambda f: f.excess_s)
    peer = worst.receiver if worst.sender == rank else worst.sender
    parts = [f"{f.sender} -> {f.receiver} {_seconds(f.after_s)} a step from step {f.onset} on, "
             f"{f.ratio:.1f}x its {_seconds(f.before_s)} before (z {f.z:.0f})"
             for f in sorted(links, key=lambda f: -f.excess_s)]
    axis = f"{worst.axis} " if worst.axis else ""
    text = (f"its {axis}link with rank {peer} slowed ({'; '.join(parts)}), the sends and recvs "
            f"at both ends alike: neither rank is late, the data is slow to cross: suspect the "
            f"link, NIC or switch between ranks {ranks_text((rank, peer))}")
    lost = min(sum(f.excess_s for f in links), max(max(f.job_rise_s, 0.0) for f in links))
    cost = cost_of(lost, steps_from(min(f.onset for f in links), context), context)
    return Verdict(rank, "communication", text, cost, peer)


def _host_evidence(finding: HostFinding, context: JobContext) -> str:
    work = "device work" if context.device else "compute and collectives"
    return (f"host time {_seconds(finding.excess_s)} a step above the other ranks' (median "
            f"over {context.judged_steps} judged steps, robust z {finding.z:.0f}), its {work} "
            f"unchanged: it stalls before its steps (data loading, Python work, a busy core) "
            f"and the other ranks wait for it")


def _link_evidence(links, collectives, all_l3: list[KernelFinding]) -> str:
    parts = []
    for f in links:
        scope = f"for its whole {f.axis} group" if f.group else f"against its {f.axis}-group peers"
        parts.append(f"{f.phase} transfer {f.ratio:.1f}x {scope}")
    shared_by = set()
    for finding in sorted(collectives, key=lambda f: -f.score)[:3]:
        same = {f.rank for f in all_l3 if f.kernel == finding.kernel and f.stream ==
                finding.stream}
        shared_by |= same
        shared = f", as on ranks {ranks_text(same)}" if len(same) > 1 else ""
        parts.append(f"{finding.kernel} on stream {finding.stream} +{finding.score:.0%} slower "
                     f"than healthy peers{shared}")
    text = "; ".join(parts)
    if any(f.group for f in links) or len(shared_by) > 1:
        return text + ": compute is normal, so suspect the link, NIC or switch these ranks share"
    return text + ": compute is normal, so suspect this rank's link, NIC or PCIe path"


def _culprit_evidence(rank: int, culprits: list[Culprit], l1: L1Result,
                      stacks: list[StackRecord], step_starts: np.ndarray | None,
                      context: JobContext) -> str:
    """What rose on the rank, when, and by how much; its host stack when one was sampled."""
    parts, steps = [], []
    spikes = [c for c in culprits if c.event != "regression"]
    for c in culprits:
        if c.event == "regression":
            until = f" to {c.last_step}" if c.last_step is not None else " on"
            parts.append(f"from step {c.step}{until}: {_WHAT[c.cause]} "
                         f"+{_seconds(c.excess_s)} a step")
            steps.append(c.step)
    if spikes:
        shown = spikes[:6]
        listed = ", ".join(f"{c.step} (+{_seconds(c.excess_s)})" for c in shown)
        more = f" and {len(spikes) - len(shown)} more" if len(spikes) > len(shown) else ""
        label = "at step" if len(spikes) == 1 else "at steps"
        parts.append(f"{_WHAT[_culprit_cause(spikes)]} {label} {listed}{more}")
        steps += [c.step for c in spikes]
    text = "; ".join(parts)
    cause = _culprit_cause(culprits)
    if cause == "host":
        flat = "its GPU time stayed flat" if context.device else \
            "its compute and collectives stayed flat"
        text += f"; {flat} (wall time up): the other ranks waited for it"
        if context.world == 1:
            text = text.replace(": the other ranks waited for it", "")
    elif cause == "compute":
        text += " on this rank only" if context.world != 1 else ""
        if context.world > 1:
            text += "; the other ranks waited for it"
    else:
        text += " on this rank only (waiting removed)"
    frame = _stack_during(rank, steps, l1, stacks, step_starts)
    if frame:
        text += f"; its host stack then ends in {frame}"
    return text


_WHAT = {"host": "host time", "compute": "compute time",
         "communication": "collective transfer time"}


def _stack_during(rank: int, steps: list[int], l1: L1Result, stacks: list[StackRecord],
                  step_starts: np.ndarray | None) -> str | None:
    """Innermost frame of the rank's last stack sample taken during one of ``steps``."""
    if step_starts is None or not stacks:
        return None
    ends = np.r_[step_starts[1:], np.iinfo(np.int64).max]
    cols = np.searchsorted(l1.steps, steps)
    windows = [(step_starts[c], ends[c]) for c in cols.tolist()]
    inside = [s for s in stacks if s.rank == rank and s.frames and
              any(lo <= s.t_ns < hi for lo, hi in windows)]
    return inside[-1].frames[-1] if inside else None
