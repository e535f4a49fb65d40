"""The kernel probe's duty cycle: how many steps it traces, fixed or within a cost budget."""

from __future__ import annotations

import numpy as np
import pytest

from argus_exporters.kernels.duty import (
    LAUNCH_COST_S,
    MAX_DUTY,
    REVIEW_EVERY,
    DutyCycle,
    choose_duty,
)


@pytest.mark.parametrize(("cost", "budget", "duty"), [
    (0.0, 0.01, 1), (0.01, 0.01, 1), (0.0101, 0.01, 2), (0.053, 0.01, 8), (0.04, 0.01, 4),
    (10.0, 0.01, MAX_DUTY), (float("nan"), 0.01, 1), (0.2, 0.05, 4)])
def test_choose_duty_is_the_smallest_power_of_two_within_budget(cost, budget, duty):
    assert choose_duty(cost, budget) == duty


def run(cycle: DutyCycle, steps: int, kernels_per_step: int, wall_s, seed: int = 0) -> list[int]:
    """Feed ``steps`` steps (each traced step launching ``kernels_per_step``); the duties."""
    rng = np.random.default_rng(seed)
    records, duties = 0, []
    for step in range(steps):
        traced = cycle.traces(step)
        records += kernels_per_step if traced else 0
        wall = wall_s(rng) if callable(wall_s) else wall_s
        cycle.observe(traced, wall, records)
        duties.append(cycle.duty)
    return duties


@pytest.mark.parametrize("seed", range(20))
def test_auto_duty_keeps_the_estimated_cost_within_budget(seed):
    """Launch-bound steps (hundreds of small kernels in a few ms) get traced rarely enough that
    the average estimated cost stays within the budget, GEMM-bound ones every step; the duty
    is a power of two and settles (no flapping) under noisy step times."""
    rng = np.random.default_rng(seed)
    kernels = int(rng.integers(50, 2000))
    step_s = float(rng.uniform(0.002, 0.5))
    budget = float(rng.choice([0.005, 0.01, 0.02]))
    cycle = DutyCycle(0, budget)
    duties = run(cycle, 40 * REVIEW_EVERY, kernels,
                 lambda r: step_s * float(r.uniform(0.95, 1.05)), seed)
    cost = kernels * LAUNCH_COST_S / step_s
    settled = duties[-20 * REVIEW_EVERY:]
    assert len(set(settled)) == 1, "the duty flapped"
    duty = settled[-1]
    assert duty & (duty - 1) == 0
    if cost <= budget * 0.95:
        assert duty == 1
    else:
        assert cost / duty <= budget * 1.06 or duty == MAX_DUTY
        assert cost / (duty // 2) > budget * 0.94 or duty == 1  # not more sparse than needed


def test_auto_duty_follows_a_change_of_workload():
    """From a launch-bound phase to a GEMM-bound one the probe traces every step again."""
    cycle = DutyCycle(0, 0.01)
    records, duties = 0, []
    for step in range(40 * REVIEW_EVERY):
        launch_bound = step < 8 * REVIEW_EVERY
        traced = cycle.traces(step)
        records += (330 if launch_bound else 20) if traced else 0
        cycle.observe(traced, 0.0075 if launch_bound else 0.2, records)
        duties.append(cycle.duty)
    assert duties[8 * REVIEW_EVERY - 1] == 8  # 330 launches in 7.5 ms: 5.3%, 1 step in 8
    assert duties[-1] == 1 and duties.index(1, 8 * REVIEW_EVERY) < 24 * REVIEW_EVERY


def test_a_fixed_duty_never_moves():
    cycle = DutyCycle(3, 0.01)
    assert set(run(cycle, 10 * REVIEW_EVERY, 5000, 0.001)) == {3}
    assert cycle.describe() == "1 step in 3"


def test_nested_powers_of_two_trace_the_same_steps():
    """Ranks with different duties slow down on shared steps: every step a rank with the larger
    duty traces is traced by the rank with the smaller one."""
    for small, large in ((1, 8), (2, 8), (4, 64)):
        a, b = DutyCycle(small, 0.01), DutyCycle(large, 0.01)
        traced_large = {s for s in range(1000) if b.traces(s)}
        assert traced_large <= {s for s in range(1000) if a.traces(s)}


def test_the_health_line_says_why():
    cycle = DutyCycle(0, 0.01)
    assert "auto" in cycle.describe()
    run(cycle, 2 * REVIEW_EVERY, 330, 0.0075)
    line = cycle.describe()
    assert line.startswith("1 step in 8 (auto: ~330 kernels") and "budget 1.0%" in line


@pytest.mark.parametrize("seed", range(20))
def test_a_decoding_lag_does_not_make_the_probe_trace_less_than_it_needs(seed):
    """The probe counts kernels as their buffers are decoded: a buffer behind the launches
    (a 64 KiB buffer holds about 370 kernel records) by however much the flushes' timing
    leaves at each review, and several on a busy host. 200 launches in a 2 ms step cost 12%:
    1 step in 16 within a 1% budget, also when three buffers were still undecoded at the cut
    from every step to 1 in 16 (the next window holds 4 traced steps against the first's 32,
    so what it catches up on weighs 8 times as much a step)."""
    rng = np.random.default_rng(seed)
    cycle = DutyCycle(0, 0.01)
    launched, duties = 0, []
    for step in range(16 * REVIEW_EVERY):
        traced = cycle.traces(step)
        launched += 200 if traced else 0
        lag = 3 * 370 if step == REVIEW_EVERY - 1 else int(rng.choice([0, 370]))
        cycle.observe(traced, 0.002, max(0, launched - lag))
        duties.append(cycle.duty)
    assert set(duties[REVIEW_EVERY:]) == {16}
