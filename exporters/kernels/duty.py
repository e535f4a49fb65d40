"""How often the kernel probe traces: a fixed 1 step in N, or ``auto`` within a cost budget.

CUPTI's kernel activity costs the thread that launches each kernel about a microsecond: on an
H200 host the training thread spent 380 us more CPU per step with 330 launches a step, 1.15 us a
launch (docs/BENCHMARKS.md, "GPU"). A GEMM-bound step hides that behind the GPU; a launch-bound
step of small kernels pays it in full (5-7% of a 7.5 ms step). ``auto`` estimates a traced
step's cost from the kernels it launched and its wall time, and traces one step in the smallest
power of two that keeps the average within the budget (ARGUS_KERNEL_BUDGET, 1% of step time).

Powers of two keep ranks whose duties differ (pipeline stages launch different kernel counts)
tracing nested sets of steps: a rank traces the steps that are multiples of its duty, so every
traced step of a rank with duty 8 is traced by a rank with duty 4 too, and the job's ranks slow
down on the same steps instead of some rank slowing every step.
"""

from __future__ import annotations

import math
from collections import deque

LAUNCH_COST_S = 1.2e-6  # CUPTI's added cost per kernel launch on the launching thread
MAX_DUTY = 256
REVIEW_EVERY = 32  # steps between two estimates
MIN_TRACED = 4  # traced steps before the first estimate
POOLED = 32  # traced steps an estimate counts kernels over (once traced)


def choose_duty(cost_fraction: float, budget: float) -> int:
    """The smallest power of two N such that ``cost_fraction / N <= budget`` (at most 256)."""
    if not cost_fraction > budget:  # also NaN: trace every step
        return 1
    return min(MAX_DUTY, 1 << math.ceil(math.log2(cost_fraction / budget)))


class DutyCycle:
    """One step in ``duty`` is traced; with ``fixed`` 0 the duty follows the estimated cost.

    ``observe`` is called once per finished step from the training thread; it is a few
    arithmetic operations, and a median of 32 numbers once every 32 steps.
    """

    def __init__(self, fixed: int, budget: float):
        self.auto = fixed <= 0
        self.duty = 1 if self.auto else int(fixed)
        self.budget = budget
        self.estimate: float | None = None  # cost of a traced step, as a fraction of its wall
        self.kernels_per_step: float | None = None
        self._traced_steps = 0
        self._steps = 0
        self._traced_at = 0  # traced steps and kernels decoded at the last estimate
        self._records_at = 0
        self._windows: deque[tuple[int, int]] = deque(maxlen=POOLED // MIN_TRACED)  # kernels
        # decoded and steps traced in each window between two estimates, newest last
        self._walls: deque[float] = deque(maxlen=REVIEW_EVERY)

    def traces(self, step: int) -> bool:
        """Whether ``step`` is one of the traced steps."""
        return step % self.duty == 0

    def observe(self, traced: bool, wall_s: float, records_total: int) -> bool:
        """Note a finished step (``records_total``: kernels decoded so far); True when the
        duty changed."""
        if not self.auto:
            return False
        self._steps += 1
        if traced:
            self._traced_steps += 1
            if wall_s > 0 and math.isfinite(wall_s):
                self._walls.append(wall_s)
        traced = self._traced_steps - self._traced_at
        if self._steps % REVIEW_EVERY or traced < MIN_TRACED or len(self._walls) < MIN_TRACED:
            return False
        # kernels per traced step over the last POOLED traced steps at least (whole windows):
        # decoding lags up to a buffer behind (several on a busy host), and what one window
        # misses the next catches up on; over a window alone, after the cut from every step to
        # 1 in 16 (4 traced steps a window instead of 32), that catch-up would weigh 8 times
        self._windows.append((records_total - self._records_at, traced))
        self._traced_at, self._records_at = self._traced_steps, records_total
        kernels = steps = 0
        for window_kernels, window_steps in reversed(self._windows):
            kernels, steps = kernels + window_kernels, steps + window_steps
            if steps >= POOLED:
                break
        self.kernels_per_step = kernels / steps
        walls = sorted(self._walls)
        wall = walls[len(walls) // 2]
        self.estimate = self.kernels_per_step * LAUNCH_COST_S / wall
        duty = choose_duty(self.estimate, self.budget)
        if duty < self.duty:  # trace more only with room to spare: no flapping at a boundary
            duty = max(duty, min(self.duty, choose_duty(self.estimate, self.budget / 2)))
        changed, self.duty = duty != self.duty, duty
        return changed

    def describe(self) -> str:
        """For the probe's health line: the duty and, in auto mode, why."""
        if not self.auto:
            return f"1 step in {self.duty}"
        if self.estimate is None:
            return f"1 step in {self.duty} (auto, budget {self.budget:.1%} of step time)"
        return (f"1 step in {self.duty} (auto: ~{self.kernels_per_step:.0f} kernels a traced "
                f"step cost ~{self.estimate:.1%} of it at {LAUNCH_COST_S * 1e6:.1f} us a launch; "
                f"budget {self.budget:.1%})")
