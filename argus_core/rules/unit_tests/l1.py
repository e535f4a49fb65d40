"""promtool tests of the L1 alerts: spikes (and a level shift that is not one), host stalls
at 8, 32 and 200 steps per window, regressions (lasting, and a job's own wander that is not
one)."""

from __future__ import annotations

from argus_core.rules.config import RulesConfig
from argus_core.rules.unit_tests.base import (
    Series,
    Steps,
    alert_labels,
    annotations,
    check,
    expect,
    fires,
    humanize_duration,
    intervals,
    rank_labels,
    rule_named,
    unit_test,
)


def l1_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """Spike (and a level shift that is not one), regression, host stall."""
    tests = []
    # The stall comes once the host window is full of samples: increase() then needs no
    # extrapolation and the expected excess is exact.
    stall_at = round(config.host_window / config.evaluation_interval) + 2
    samples = stall_at + 10
    steps = Steps(config, samples)
    # A spike big enough that the interval holding it is slow on average, as a level shift's
    # first interval is: the alert must wait until the steps after it are back to normal.
    spike_s = ((config.spike_ratio - 1) * steps.per + 2.2) * steps.step_s
    series = steps.series(rank_labels(config, "spiky", 0), stall={stall_at: spike_s})
    series += steps.series(rank_labels(config, "spiky", 1, dp=1), stall={stall_at: spike_s})
    series += steps.series(rank_labels(config, "shifted", 0), slow_from=stall_at, factor=4.0)
    series += steps.series(rank_labels(config, "shifted", 1, dp=1), slow_from=stall_at, factor=4.0)
    rule = rule_named(groups, "ArgusIterationSpike")
    ratio = (steps.step_s + spike_s) / steps.step_s
    # The interval holding the spike still looks like a level shift (its steps are slow on
    # average); the condition starts one evaluation later.
    tests.append(unit_test(config, "ArgusIterationSpike: a spike fires; a level shift does not",
                       series, alerts=fires(
                           config, "ArgusIterationSpike", stall_at + 1, config.for_spike,
                           [expect(alert_labels(config, rule, job="spiky"),
                                    annotations(rule, **{"$labels.job": "spiky",
                                                          '$value | printf "%.1f"':
                                                          f"{ratio:.1f}"}))])))

    tests.append(noisy_spike_test(config, groups, stall_at, samples))
    tests += host_stall_tests(config, groups, stall_at, samples)
    tests.append(regression_test(config, groups))
    tests.append(wander_test(config, groups))
    return tests


def noisy_spike_test(config: RulesConfig, groups: list[dict], stall_at: int,
                     samples: int) -> dict:
    """ArgusIterationSpike on a noisy job: every interval holds a blip of 1.9x (a busy CPU
    job's usual), so its usual window ratio is 1.9 and a spike must reach 1.9^2 = 3.6x. A
    2.6x step is its noise and pages nothing; a 6x step pages, once the job is back to its
    pace."""
    rule = rule_named(groups, "ArgusIterationSpike")
    steps = Steps(config, samples)
    blips = {k: 0.9 * steps.step_s for k in range(1, samples)}
    small = {**blips, stall_at: 1.6 * steps.step_s}
    big_s = 5.0 * steps.step_s
    big = {**blips, stall_at: big_s}
    series = []
    for rank in range(2):
        series += steps.series(rank_labels(config, "noisy-small", rank, dp=rank), stall=small)
        series += steps.series(rank_labels(config, "noisy-big", rank, dp=rank), stall=big)
    ratio = (steps.step_s + big_s) / steps.step_s
    return unit_test(config, "ArgusIterationSpike on a noisy job: beyond its own noise only",
                 series, alerts=fires(
                     config, "ArgusIterationSpike", stall_at + 1, config.for_spike,
                     [expect(alert_labels(config, rule, job="noisy-big"),
                              annotations(rule, **{"$labels.job": "noisy-big",
                                                    '$value | printf "%.1f"':
                                                    f"{ratio:.1f}"}))]))


HOST_STEPS_PER_INTERVAL = (1, 4, 25)  # 8, 32 and 200 steps per default host window


def host_stall_tests(config: RulesConfig, groups: list[dict], stall_at: int,
                     samples: int) -> list[dict]:
    """ArgusHostStall at several steps per window: the rank whose GPU idled during a spike
    fires; a healthy rank whose host is 1.5% busier than its peers' on every step (a cost
    under the floor, summed over however many steps fit in the window) never does, even
    when a small compute spike on another rank opens the gate."""
    rule = rule_named(groups, "ArgusHostStall")
    host_s = 0.01
    tests = []
    for per in HOST_STEPS_PER_INTERVAL:
        steps = Steps(config, samples, steps_per_interval=per)
        window_steps = round(config.host_window / config.evaluation_interval) * per
        if window_steps <= config.exporter_window_steps:
            # One stall that slows its interval on average: the alert waits one evaluation
            # for the job to be back to its pace, with the spike still in the gauges' window.
            stall_s = ((config.spike_ratio - 1) * steps.per + 2.2) * steps.step_s
            stalls, fires_at = {stall_at: stall_s}, stall_at + 1
        else:
            # The gauges' window is shorter than an interval: a stall that leaves its
            # interval at pace (so the spike counts at once), twice: one alone costs the job
            # under the floor of the window's time (stall < 2 x floor), two more.
            floor_s = config.min_cost_share * config.host_window
            stall_s = 1.5 * floor_s
            if not ((config.spike_ratio - 1) * steps.step_s <= stall_s
                    < (config.spike_guard - 1) * steps.per * steps.step_s):
                continue  # these settings leave no such stall: nothing to test at this rate
            stalls, fires_at = {stall_at - 1: stall_s, stall_at: stall_s}, stall_at
        stalled, busy = f"stall-{per}", f"busy-host-{per}"
        series = []
        for rank in range(3):
            series += steps.series(rank_labels(config, stalled, rank, dp=rank), host_s=host_s,
                                   stall=stalls, stalled=rank == 2)
        small_spike = (config.spike_ratio - 1 + 0.1) * steps.step_s
        for rank in range(3):
            extra = 0.015 * steps.step_s if rank == 1 else 0.0
            series += steps.series(rank_labels(config, busy, rank, dp=rank),
                                   host_s=host_s + extra, stall={stall_at: small_spike})
        expected = [expect(
            alert_labels(config, rule, **rank_labels(config, stalled, 2, dp=2)),
            annotations(rule, **{"$labels.rank": "2", "$labels.host": "node-0",
                                  "$labels.job": stalled, "$value | humanizeDuration":
                                  humanize_duration(sum(stalls.values()))}))]
        tests.append(unit_test(
            config, f"ArgusHostStall at {window_steps} steps per window: the rank whose GPU "
                    f"idled during the spike, never a healthy rank with a busier host",
            series, alerts=[check(config, fires_at - 1, "ArgusHostStall", []),
                            check(config, fires_at, "ArgusHostStall", expected)]))
    return tests


def regression_test(config: RulesConfig, groups: list[dict]) -> dict:
    """A slowdown that lasts: the alert fires once the recent median flips and keeps firing
    more than an hour later (a baseline that absorbed the slowdown would let it resolve)."""
    rule = rule_named(groups, "ArgusIterationRegression")
    interval = config.evaluation_interval
    recent = round(config.regression_recent / interval)
    # A baseline of full recent windows and two recent windows of the job's wander (the
    # noise the threshold needs) before the onset.
    onset = 4 * recent + 2
    # Longer than an hour (where a median over the hour before had absorbed it), within the
    # baseline window (past it, the slower pace is the job's own).
    lasting = round(min(max(75 * 60, config.regression_recent * 7.5),
                        0.9 * config.regression_baseline) / interval)
    length = onset + lasting + 2
    base, factor = 2.0, 1.5
    values = [base] * onset + [base * factor] * (length - onset)
    # The recent median flips once more than half of its window's samples are slow.
    flips = onset + recent // 2
    expected = [expect(alert_labels(config, rule, job="slower"),
                        annotations(rule, **{"$labels.job": "slower",
                                              '$value | printf "%.2f"': f"{factor:.2f}"}))]
    return unit_test(config, "ArgusIterationRegression: recent median over the best before, "
                 "still firing after the slowdown lasted",
                 [Series("job:argus_iteration_seconds:max_rate", {"job": "slower"}, values)],
                 alerts=[*fires(config, "ArgusIterationRegression", flips,
                                 config.for_regression, expected),
                         check(config, onset + lasting, "ArgusIterationRegression",
                                expected)])


# Medians of one recent window each, in ms, of a healthy 4-rank CPU job on a 2-vCPU VM (no
# stack, file sink): its pace wanders 1.16x from one window to the next.
VM_WANDER_MS = (89.4, 104.1, 99.4, 90.1, 92.3, 94.8, 93.4)


def wander_test(config: RulesConfig, groups: list[dict]) -> dict:
    """A job whose pace wanders as a shared VM's does (levels ``VM_WANDER_MS``, one per recent
    window, and per-sample jitter that only ever slows it) is never paged, over more than an
    hour; the same job's lasting 1.6x slowdown from its best pace is, once it fills the recent
    window. The best level has no jitter and lasts a little longer than a window, so the
    baseline is exactly it."""
    import numpy as np

    rule = rule_named(groups, "ArgusIterationRegression")
    recent = round(config.regression_recent / config.evaluation_interval)
    best = min(VM_WANDER_MS)
    lengths = [recent + 4 if level == best else recent for level in VM_WANDER_MS]
    pattern = np.repeat(np.asarray(VM_WANDER_MS) / 1000, lengths)
    jitter = np.exp(np.abs(np.random.default_rng(7).normal(0.0, 0.02, len(pattern))))
    pattern = np.where(pattern == best / 1000, pattern, pattern * jitter)
    onset = 3 * len(pattern)
    length = onset + 3 * recent
    healthy = [float(v) for v in np.resize(pattern, length)]
    factor = 1.6
    slower = healthy[:onset] + [factor * best / 1000] * (length - onset)
    due = onset + recent + intervals(config, config.for_regression) + 1
    expected = [expect(alert_labels(config, rule, job="slower"),
                        annotations(rule, **{"$labels.job": "slower",
                                              '$value | printf "%.2f"': f"{factor:.2f}"}))]
    checks = [check(config, at, "ArgusIterationRegression", [])
              for at in range(4 * recent, onset + recent // 2, recent // 4)]
    checks += [check(config, at, "ArgusIterationRegression", expected)
               for at in range(due, length, recent // 4)]
    return unit_test(config, "ArgusIterationRegression: a job's own wander (1.16x from window to "
                 "window) is not a regression; a lasting 1.6x slowdown on the same job is",
                 [Series("job:argus_iteration_seconds:max_rate", {"job": "wandering"}, healthy),
                  Series("job:argus_iteration_seconds:max_rate", {"job": "slower"}, slower)],
                 alerts=checks)
