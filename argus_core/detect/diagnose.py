"""Progressive diagnosis of one job's trace: L1, then L2 and L3 on the judged steps, verdicts.

Judged steps are past warm-up and not L1 spikes. L2 finds each rank's own onset; L3 compares
kernels from the latest onset found (L1's regression or an L2 rank's) when enough steps follow
it, so a late straggler is not diluted by its healthy steps.

``diagnose(trace)`` returns a ``Diagnosis``; ``Diagnosis.to_json()`` is the documented
``argus diagnose --json`` contract (DESIGN.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from argus_core.detect.arrival import collective_times
from argus_core.detect.attribution import AttributionConfig, Suspect, attribute
from argus_core.detect.cost import MIN_COST_SHARE, Cost, JobContext, cost_of, steps_from
from argus_core.detect.cpu_wait import cpu_wait_rise, extra_cpu_wait
from argus_core.detect.host import HostConfig, HostFinding, detect_host
from argus_core.detect.l1 import L1Config, L1Result, detect_l1
from argus_core.detect.l2 import L2Config, L2Result, detect_l2
from argus_core.detect.l3 import KernelScores, L3Config
from argus_core.detect.l3_findings import KernelFinding, kernel_findings
from argus_core.detect.links import LinkConfig, LinkFinding, detect_links
from argus_core.detect.placement import device_starts, place_kernels
from argus_core.detect.stages import stage_classes
from argus_core.detect.steps import StepMatrix, step_matrix
from argus_core.detect.verdict import Verdict, VerdictConfig, build_verdicts
from argus_core.stats.compress import CompressionConfig
from argus_core.summaries import DEFAULT_WINDOW_S
from argus_core.trace import Trace


@dataclass(frozen=True)
class DiagnoseConfig:
    """All thresholds, grouped by level; defaults are the documented ones."""

    l1: L1Config = field(default_factory=L1Config)
    l2: L2Config = field(default_factory=L2Config)
    l3: L3Config = field(default_factory=L3Config)
    host: HostConfig = field(default_factory=HostConfig)
    links: LinkConfig = field(default_factory=LinkConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    window_s: float = DEFAULT_WINDOW_S
    peer_axis: str = "pp"  # L3 compares ranks at the same position on this axis
    min_onset_steps: int = 5  # L3 starts at the latest onset only if this many steps follow

    def with_overrides(self, settings: list[str]) -> DiagnoseConfig:
        """A copy with ``LEVEL.NAME=VALUE`` settings applied (``l2.alpha=0.01``,
        ``l3.min_score=0.2``, ``window_s=30``); raises ValueError naming a bad one."""
        config = self
        for setting in settings:
            key, sep, text = setting.partition("=")
            if not sep:
                raise ValueError(f"{setting!r}: expected NAME=VALUE")
            level, _, name = key.strip().rpartition(".")
            target = getattr(config, level) if level else config
            if not dataclasses.is_dataclass(target) or name not in {
                    f.name for f in dataclasses.fields(target)}:
                raise ValueError(f"{setting!r}: no threshold {key.strip()!r} (see the "
                                 f"thresholds table in docs/diagnosis.md)")
            current = getattr(target, name)
            try:
                value = (text.strip().lower() in ("1", "true", "yes") if isinstance(current, bool)
                         else type(current)(text.strip()))
            except ValueError:
                raise ValueError(f"{setting!r}: expected a {type(current).__name__}") from None
            updated = dataclasses.replace(target, **{name: value})
            config = (dataclasses.replace(config, **{level: updated}) if level else updated)
        return config


@dataclass
class Diagnosis:
    """Everything found for one job, plus what the report and plots need."""

    job: str
    matrix: StepMatrix
    l1: L1Result
    l2: L2Result
    l3: list[KernelFinding]
    excused: list[KernelFinding]
    verdicts: list[Verdict]
    scores: KernelScores | None
    warnings: list[str] = field(default_factory=list)
    kernel_count: int = 0
    host: list[HostFinding] = field(default_factory=list)
    minor: list[Verdict] = field(default_factory=list)  # found, but costing under the floor
    context: JobContext = field(default_factory=JobContext)
    suspects: list[Suspect] = field(default_factory=list)  # hardware units the verdicts share
    links: list[LinkFinding] = field(default_factory=list)  # point-to-point links that slowed
    cost_floor: float = MIN_COST_SHARE  # the share of a step a verdict costs at least

    def l2_cost(self, excess_s: float, onset: int | None) -> Cost:
        """The cost of an L2 finding's excess, from its onset (or every judged step) on."""
        return cost_of(excess_s if np.isfinite(excess_s) else 0.0,
                       steps_from(onset, self.context), self.context)

    def to_json(self) -> dict:
        """The ``argus diagnose --json`` document (DESIGN.md contract)."""
        return {
            "job": self.job,
            "l1": {"spikes": [{"step": s, "ratio": _num(r, 2)} for s, r in self.l1.spikes],
                   "regressions": [{"step": s, "ratio": _num(r, 2)}
                                   for s, r in self.l1.regressions]},
            "l2": {"stragglers": [{"rank": f.rank, "phase": f.phase, "axis": f.axis,
                                   "ratio": _num(f.ratio, 2), "z": _num(f.z, 1),
                                   **_cost_json(self.l2_cost(f.excess_s, f.onset))}
                                  for f in self.l2.findings],
                   "host": [{"rank": f.rank, "excess_s": _num(f.excess_s, 6),
                             "z": _num(f.z, 1)} for f in self.host],
                   "links": [{"from": f.sender, "to": f.receiver, "axis": f.axis,
                              "step": f.onset, "ratio": _num(f.ratio, 2), "z": _num(f.z, 1),
                              "before_s": _num(f.before_s, 6), "after_s": _num(f.after_s, 6),
                              **_cost_json(cost_of(f.cost_s, steps_from(f.onset,
                                                                        self.context),
                                                   self.context))}
                             for f in self.links]},
            "l3": {"stragglers": [{"rank": f.rank, "kernel": f.kernel, "stream": f.stream,
                                   "score": _num(f.score, 3)} for f in self.l3]},
            "verdict": [{"rank": v.rank, "cause": v.cause, "evidence": v.evidence,
                         **_cost_json(v.cost), **_peer_json(v)} for v in self.verdicts],
            "minor": [{"rank": v.rank, "cause": v.cause, "evidence": v.evidence,
                       **_cost_json(v.cost)} for v in self.minor],
            "suspects": [s.to_json() for s in self.suspects],
        }


_JSON_CAP = 1e6  # stands for "unbounded" (a peer median of 0): JSON has no Infinity


def _num(value: float, digits: int) -> float:
    """A finite, rounded number for the JSON document."""
    return round(min(float(value), _JSON_CAP), digits)


def _peer_json(verdict: Verdict) -> dict:
    """The added ``peer`` of a link's verdict: the link's other end."""
    return {} if verdict.peer is None else {"peer": verdict.peer}


def _cost_json(cost: Cost | None) -> dict:
    """The added cost fields of a finding or verdict (absent when no time is behind it)."""
    if cost is None:
        return {}
    out = {"cost_s": _num(cost.seconds, 6)}
    if cost.share is not None:
        out["cost_share"] = _num(cost.share, 4)
    if cost.gpu_seconds is not None:
        out["gpu_seconds"] = _num(cost.gpu_seconds, 3)
    return out


def diagnose(trace: Trace, config: DiagnoseConfig | None = None) -> Diagnosis:
    """Run L1, L2 and L3 on one job's trace and combine them into verdicts."""
    config = config or DiagnoseConfig()
    warnings = []
    matrix = step_matrix(trace.steps)
    silent = sorted(set(trace.rank_ids.tolist()) - set(matrix.ranks.tolist()))
    if silent:
        warnings.append(f"{len(silent)} rank(s) have no step records and are left out of L1/L2: "
                        f"{', '.join(map(str, silent[:10]))}{' ...' if len(silent) > 10 else ''}")
    coords = trace.coords(matrix.ranks)
    placement = place_kernels(trace.kernels, matrix)
    warnings += placement.warnings
    times = collective_times(matrix, coords, device_starts(trace.kernels, placement, matrix))
    device = bool(len(trace.kernels)) or bool((trace.steps.gpu_t_ns >= 0).any())
    l1 = detect_l1(matrix, config.l1.on_clock(device), times)
    calm = l1.judged & ~l1.spike_mask
    if len(matrix.steps) and not calm.any():
        warnings.append("no steady steps to compare ranks on (too few steps after warm-up)")
    stages = stage_classes(trace.kernels, placement.step_col, matrix.ranks, coords)
    l2 = (detect_l2(matrix, coords, calm, config.l2.on_clock(device), times, stages)
          if calm.any() else L2Result())
    steps = _kernel_steps(matrix, calm, l1, l2, config.min_onset_steps)
    scores, l3, excused = kernel_findings(trace, matrix, steps, placement, config.window_s,
                                          config.peer_axis, config.compression, config.l3)
    step_s = float(np.nanmedian(l1.iteration_s[l1.judged])) if l1.judged.any() else None
    context = JobContext(step_s, len(matrix.ranks), int(calm.sum()),
                         int(matrix.steps[-1]) if len(matrix.steps) else None, device)
    host = (detect_host(matrix, times, calm, step_s, config.host) if step_s else [])
    links = detect_links(trace.steps, matrix, calm, config.links, l1.iteration_s)
    warnings += [f"link {f.sender} -> {f.receiver} slowed {f.ratio:.1f}x from step {f.onset} "
                 f"while its ends waited {f.cpu_wait_rise_s * 1e3:.1f} ms a step longer for a "
                 f"CPU: the host's load, not the link (no verdict)"
                 for f in links if f.short_of_cpu and (step_s is None or f.cost_s >=
                                                      config.verdict.min_cost_share * step_s)]
    links = [f for f in links if not f.short_of_cpu]
    minor: list[Verdict] = []
    verdicts = build_verdicts(l1, l2, l3, trace.stacks, matrix.t_ns, host, context,
                              config.verdict, minor, links,
                              lambda rank, onset: extra_cpu_wait(matrix, rank, onset),
                              lambda rank, first, last: cpu_wait_rise(matrix, rank, first, last))
    suspects = attribute(trace.ranks, [(v.rank, v.cause) for v in verdicts],
                         matrix.ranks.tolist(),
                         {v.rank: v.cost.seconds for v in verdicts if v.cost is not None},
                         config.attribution,
                         [(v.rank, v.peer) for v in verdicts if v.peer is not None])
    return Diagnosis(trace.job, matrix, l1, l2, l3, excused, verdicts, scores, warnings,
                     len(trace.kernels), host, minor, context, suspects, links,
                     config.verdict.min_cost_share)


def _kernel_steps(matrix: StepMatrix, calm: np.ndarray, l1: L1Result, l2: L2Result,
                  min_steps: int) -> np.ndarray:
    """Steps whose kernels L3 compares: the calm ones from the latest onset on, if enough."""
    onsets = [step for step, _ in l1.regressions[-1:]]
    onsets += [f.onset for f in l2.findings if f.onset is not None]
    if onsets:
        later = calm & (matrix.steps >= max(onsets))
        if later.sum() >= min_steps:
            return later
    return calm


def step_range(matrix: StepMatrix) -> str:
    """'0-39' style description of the recorded steps."""
    if len(matrix.steps) == 0:
        return "none"
    return f"{int(np.min(matrix.steps))}-{int(np.max(matrix.steps))}"
