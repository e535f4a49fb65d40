"""What a finding costs the job: the seconds a step the job would save without the rank's
excess, their share of the job's step, and the GPU-seconds lost over the steps it lasted.

Synchronous training runs at the pace of its slowest rank, so a rank's excess (its own extra
compute, transfer or host time) is what every other rank waits for: the job's step is at most
that much shorter without it, and never by more than the whole step. ``MIN_COST_SHARE`` is the
floor a verdict and a per-rank alert must reach (the exporters' own budget, 2% of a step: a
finding that costs less than watching for it is not worth acting on).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_COST_SHARE = 0.02


@dataclass(frozen=True)
class JobContext:
    """What the cost of a finding is measured against."""

    step_s: float | None = None  # the job's median step (iteration) time
    world: int = 0  # ranks in the job
    judged_steps: int = 0
    last_step: int | None = None  # the last recorded step
    device: bool = True  # phases timed on a device (CUDA events), not on the host clock


@dataclass(frozen=True)
class Cost:
    """What a rank's excess costs the job."""

    seconds: float  # per step: how much shorter the job's step would be without the excess
    share: float | None  # seconds over the job's median step (None: no step time known)
    gpu_seconds: float | None  # seconds x world size x steps affected
    steps: int  # steps the cost is counted over


def cost_of(seconds: float, steps: int, context: JobContext) -> Cost:
    """The cost of ``seconds`` of excess a step over ``steps`` steps."""
    step_s = context.step_s if context.step_s and context.step_s > 0 else None
    seconds = max(float(seconds), 0.0)
    if step_s is not None:
        seconds = min(seconds, step_s)
    share = seconds / step_s if step_s is not None else None
    gpu = seconds * context.world * steps if context.world else None
    return Cost(seconds, share, gpu, steps)


def steps_from(onset: int | None, context: JobContext) -> int:
    """Judged steps affected by a finding that started at ``onset`` (None: all of them)."""
    if onset is None or context.last_step is None:
        return context.judged_steps
    return max(min(context.last_step - onset + 1, context.judged_steps), 1)
