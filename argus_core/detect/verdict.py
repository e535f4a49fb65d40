"""Verdicts: one cause per flagged rank (compute, communication or host), with evidence in words.

Compute wins over communication: a rank with slow compute also shows odd collectives (short,
because it arrives last), and its peers' long collectives are waiting (case 5). A rank is
"communication" when only its collectives' transfer time is slow (waiting removed). Ranks L1
attributes a spike or a regression to get a verdict even when L2 and L3 saw nothing: "host"
when the excess sits in their host time (wall - GPU) or device idle time while their GPU work
stayed flat (case 4, and a sustained host stall), else the part of their own time that rose.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from argus_core.detect.l1 import L1Result
from argus_core.detect.l2 import L2Result
from argus_core.detect.l3_findings import KernelFinding
from argus_core.schema import StackRecord


@dataclass(frozen=True)
class Verdict:
    """The most likely cause for one rank and why."""

    rank: int
    cause: str
    evidence: str


def ranks_text(ranks: Iterable[int]) -> str:
    """Ranks for a message: sorted, the first eight, then how many more."""
    ranks = sorted(set(ranks))
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def build_verdicts(l1: L1Result, l2: L2Result, l3: list[KernelFinding],
                   stacks: list[StackRecord] | None = None,
                   step_starts: np.ndarray | None = None) -> list[Verdict]:
    """Combine L1 spike culprits, L2 findings and L3 findings into one verdict per rank."""
    l2_by_rank = defaultdict(list)
    for finding in l2.findings:
        l2_by_rank[finding.rank].append(finding)
    l3_by_rank = defaultdict(list)
    for finding in l3:
        l3_by_rank[finding.rank].append(finding)
    late = defaultdict(list)
    for role in l2.roles:
        if role.role == "late":
            late[role.rank].append(role)
    culprits = defaultdict(list)
    for culprit in l1.culprits:
        culprits[culprit.rank].append(culprit)
    job_onset = f" since step {l1.regressions[-1][0]}" if l1.regressions else ""

    verdicts = []
    for rank in sorted(set(l2_by_rank) | set(l3_by_rank) | set(culprits)):
        phases = [f for f in l2_by_rank[rank] if f.kind == "compute"]
        links = [f for f in l2_by_rank[rank] if f.kind == "communication"]
        kernels = [f for f in l3_by_rank[rank] if not f.comm]
        collectives = [f for f in l3_by_rank[rank] if f.comm]
        own_onsets = [f.onset for f in phases if f.onset is not None]
        onset = f" since step {min(own_onsets)}" if own_onsets else job_onset
        if phases or kernels:
            verdicts.append(Verdict(rank, "compute", _compute_evidence(
                phases, kernels, late[rank], onset)))
        elif links or collectives:
            verdicts.append(Verdict(rank, "communication", _link_evidence(
                rank, links, collectives, l3)))
        elif culprits[rank]:
            verdicts.append(Verdict(rank, culprits[rank][0].cause, _culprit_evidence(
                rank, culprits[rank], l1, stacks or [], step_starts)))
    return verdicts


def _compute_evidence(phases, kernels, late_roles, onset: str) -> str:
    parts = [f"{f.phase} {f.ratio:.1f}x its {f.axis}-group peers (robust z {f.z:.0f})"
             for f in sorted(phases, key=lambda f: -f.ratio)]
    if kernels:
        top = sorted(kernels, key=lambda f: -f.score)[:3]
        parts.append("slow kernels: " + ", ".join(f"{k.kernel} +{k.score:.0%}" for k in top))
    text = "; ".join(parts) + onset
    if late_roles:
        names = sorted({r.phase for r in late_roles})
        waiting = sorted({p for r in late_roles for p in r.peers})
        share = min(r.share for r in late_roles)
        text += (f". Its {', '.join(names)} take {share:.2f}x the time of its peers (ranks "
                 f"{ranks_text(waiting)} wait for it there): it arrives late, so the network "
                 f"is not the cause")
    return text


def _link_evidence(rank: int, links, collectives, all_l3: list[KernelFinding]) -> str:
    parts = [f"{f.phase} {f.ratio:.1f}x for its whole {f.axis} group" for f in links]
    for finding in sorted(collectives, key=lambda f: -f.score)[:3]:
        same = {f.rank for f in all_l3 if f.kernel == finding.kernel and f.stream ==
                finding.stream}
        shared = f", as on ranks {ranks_text(same)}" if len(same) > 1 else ""
        parts.append(f"{finding.kernel} on stream {finding.stream} +{finding.score:.0%} slower "
                     f"than healthy peers{shared}")
    text = "; ".join(parts)
    return text + ": compute is normal, so suspect the link, NIC or switch these ranks share"


def _culprit_evidence(rank: int, culprits, l1: L1Result, stacks: list[StackRecord],
                      step_starts: np.ndarray | None) -> str:
    """What rose on the rank, when, and by how much; its host stack when one was sampled."""
    parts, steps = [], []
    for c in culprits:
        if c.event == "regression":
            until = f" to {c.last_step}" if c.last_step is not None else " on"
            when = f"from step {c.step}{until}"
            steps += [c.step]
        else:
            when = f"at step {c.step}"
            steps.append(c.step)
        parts.append(f"{when}: {_WHAT[c.cause]} +{c.excess_s:.3g} s per step")
    text = "; ".join(parts)
    cause = culprits[0].cause
    if cause == "host":
        text += ("; its GPU time stayed flat (wall time up, compute and collectives "
                 "unchanged): the other ranks waited for it")
    elif cause == "compute":
        text += " on this rank only; the other ranks waited for it"
    else:
        text += " on this rank only (waiting removed)"
    frame = _stack_during(rank, steps, l1, stacks, step_starts)
    if frame:
        text += f"; its host stack then ends in {frame}"
    return text


_WHAT = {"host": "host time (wall - GPU, and device idle)", "compute": "compute time",
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
