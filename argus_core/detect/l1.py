"""L1: the job's iteration time. Rare spikes (jitter) and sustained regressions (change points).

Synchronous training runs at the speed of its slowest rank, so L1 looks at one series: the max
over ranks of each step's wall time. (Per-rank L1 on synchronised step times would flag every
rank at once.) Candidate spikes are steps ``spike_ratio`` above the centred rolling median; a
candidate is a *spike* only when it also stands out of this job's own step-to-step noise, else
it is a *blip*. The noise is read from the job itself, heavy tails included: the log ratios'
upper quartile and 90th percentile (in a short job, the level a few spikes of its own stay
above) give the scale ``b`` of an exponential (Laplace) tail, the larger of the two, and a
spike exceeds ``b * ln(n / (2 * spike_alpha))`` over n judged steps (Bonferroni: about
``spike_alpha`` false spikes per job), so a quiet GPU job's 1.5x stall is a spike and a noisy
CPU job's 2x blip is not. Regressions are shifts of the log iteration time found by binary
segmentation, after spikes and blips are replaced by that median, in units of its noise
widened by its drift (``stats.changepoint.drift_noise_scale``).

Every spike and regression is then attributed to the ranks that caused it: the late arriver,
whose *own* time rose while the others' rise is waiting for it. A rank's time per step is split
(``argus_core.detect.arrival``) into compute phases, collective transfer, waiting, host time
(wall - GPU; only the part before the step's device work where kernels show when that began)
and device idle time (GPU time in no phase: a host stall in mid-step). A culprit's compute,
transfer, host or idle time rose, against the median rise of the other ranks, by at least
``attribution_share`` of the job's extra time; its cause is the part that rose most (host and
idle: host, the GPU work stayed flat; compute; transfer: communication), and an event has one
cause, that of the largest rise. On the host clock (``L1Config.on_clock``) the part must also
reach ``host_min_rise`` times its own level before, beyond the other ranks' rise: the scheduler
moves a rank's share of shared cores by a fifth and more for tens of steps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

from argus_core.detect.arrival import CollectiveTimes, collective_times
from argus_core.detect.steps import StepMatrix
from argus_core.schema import AXES
from argus_core.stats.changepoint import change_points, drift_noise_scale, noise_scale
from argus_core.stats.robust import nanmedian


@dataclass(frozen=True)
class L1Config:
    """Thresholds of the iteration-time checks."""

    warmup_steps: int = 2  # first steps (compilation, cache warm-up) are not judged
    spike_ratio: float = 1.5  # a spike is this much above the rolling median
    spike_alpha: float = 0.01  # expected spikes per job from the job's own noise
    window: int = 9  # rolling median window, in steps (centred)
    min_regression: float = 1.1  # a regression slows the job by at least 10%
    change_threshold: float = 6.0  # CUSUM statistic, in noise standard deviations
    min_segment: int = 3  # steps on each side of a change point
    noise_floor: float = 0.003  # log-scale noise never assumed below 0.3%
    attribution_share: float = 0.5  # a culprit explains at least half of a spike's excess
    min_rise: float = 1.0  # ... and its part reached this multiple of its own level
    host_min_rise: float = 1.5  # the same on the host clock (see ``on_clock``)

    def on_clock(self, device: bool) -> L1Config:
        """The thresholds for ranks timed on a device (CUDA events) or on the host clock.

        On the host clock a rank's phase times include the share of its cores the scheduler
        gave it, which moves by a fifth and more for tens of steps in healthy real jobs on
        shared cores: a culprit's part must reach ``host_min_rise`` times its own level,
        beyond the other ranks' rise. The culprits of the real jobs' faults rose 1.8x and
        more."""
        if device or self.host_min_rise <= self.min_rise:
            return self
        return replace(self, min_rise=self.host_min_rise)


@dataclass
class Culprit:
    """A rank that explains a spike or a regression, and why."""

    rank: int
    step: int  # the spike's step, or the regression's first step
    cause: str  # host, compute or communication
    excess_s: float  # extra time per step in that part of the rank's own time
    event: str = "spike"  # spike, blip (a candidate within the job's noise) or regression
    last_step: int | None = None  # regression: last step of the slow segment



@dataclass
class L1Result:
    """Iteration-time series and what was found in it."""

    steps: np.ndarray
    iteration_s: np.ndarray
    baseline_s: np.ndarray  # centred rolling median
    judged: np.ndarray  # bool per step: past warm-up and recorded
    spikes: list[tuple[int, float]] = field(default_factory=list)  # (step, ratio)
    blips: list[tuple[int, float]] = field(default_factory=list)  # candidates within the noise
    spike_threshold: float = float("nan")  # ratio a spike reaches (the job's own noise)
    regressions: list[tuple[int, float]] = field(default_factory=list)  # (onset step, ratio)
    culprits: list[Culprit] = field(default_factory=list)
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # regression: (before
    # start, onset, after end) as judged-step indices into ``steps``

    @property
    def spike_mask(self) -> np.ndarray:
        """Bool per step: the step is a spike or a blip (not a steady step)."""
        return np.isin(self.steps, [s for s, _ in self.spikes + self.blips])

    @property
    def steady_mask(self) -> np.ndarray:
        """Judged steps that are no spike, after the last regression's onset (one regime)."""
        mask = self.judged & ~self.spike_mask
        if self.regressions:
            mask &= self.steps >= self.regressions[-1][0]
        return mask


def rolling_median(y: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median ignoring NaN; the window shrinks at the edges."""
    if len(y) == 0:
        return np.zeros(0)
    half = window // 2
    padded = np.concatenate([np.full(half, np.nan), y, np.full(half, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)
    return nanmedian(windows, axis=1)


def detect_l1(matrix: StepMatrix, config: L1Config | None = None,
              times: CollectiveTimes | None = None) -> L1Result:
    """Spikes and regressions of the job's iteration time (max wall time over ranks), each
    attributed to its culprit ranks. ``times`` splits the ranks' time (computed here, with
    every rank in one collective group, when not given)."""
    config = config or L1Config()
    recorded = ~np.all(np.isnan(matrix.wall), axis=0)
    iteration = np.max(np.where(np.isnan(matrix.wall), -np.inf, matrix.wall), axis=0,
                       initial=-np.inf)
    iteration[~recorded] = np.nan
    judged = recorded & (np.arange(len(matrix.steps)) >= config.warmup_steps)
    series = np.where(judged, iteration, np.nan)
    baseline = rolling_median(series, config.window)
    result = L1Result(matrix.steps, iteration, baseline, judged)
    if judged.sum() < 3:
        return result

    with np.errstate(all="ignore"):
        ratio = series / baseline
    spike = judged & (ratio >= config.spike_ratio)
    result.spike_threshold = spike_threshold(ratio[judged], config)
    significant = spike & (ratio >= result.spike_threshold)
    for mask, out in ((significant, result.spikes), (spike & ~significant, result.blips)):
        out += [(int(s), float(r)) for s, r in zip(matrix.steps[mask], ratio[mask], strict=True)]

    # Regressions on the log series with spikes flattened to the local median.
    idx = np.flatnonzero(judged)
    y = np.log(np.where(spike, baseline, series)[idx])
    sigma = drift_noise_scale(y, noise_scale(y, config.noise_floor))
    cps = change_points(y, config.change_threshold, config.min_segment,
                        np.log(config.min_regression), sigma)
    bounds = [0, *cps, len(y)]
    levels = [float(np.median(y[lo:hi])) for lo, hi in itertools.pairwise(bounds)]
    rise = np.log(config.min_regression)
    for i, cp in enumerate(cps):
        if levels[i + 1] - levels[i] < rise:
            continue
        # one episode while the job stays that much slower than before it (a slowdown that
        # rises in steps, or wavers, is one): the culprits are judged over all of it
        last = i + 1
        while last + 1 < len(levels) and levels[last + 1] - levels[i] >= rise:
            last += 1
        result.regressions.append((int(matrix.steps[idx[cp]]),
                                   float(np.exp(levels[i + 1] - levels[i]))))
        result.segments.append((int(idx[bounds[i]]), int(idx[cp]),
                                int(idx[bounds[last + 1] - 1]) + 1))
    if times is None:
        times = collective_times(matrix, np.zeros((len(matrix.ranks), len(AXES)), np.int64))
    result.culprits = attribute(matrix, result, times, config)
    return result


SPIKES_TOLERATED = 3  # spikes of the job itself that may sit above its noise's tail level


def spike_threshold(ratio: np.ndarray, config: L1Config) -> float:
    """The ratio to the rolling median that a step reaches by noise in about ``spike_alpha``
    of jobs: an exponential upper tail scaled from the log ratios' upper quartile and 90th
    percentile (or the level that leaves ``SPIKES_TOLERATED`` steps above it, in a short job:
    robust to a few spikes themselves; heavier than a normal tail), never below
    ``spike_ratio``."""
    x = np.log(ratio[np.isfinite(ratio) & (ratio > 0)])
    if len(x) < 4:
        return config.spike_ratio
    # An exponential upper tail has a share 1 - q of the steps ln(0.5 / (1 - q)) scales above
    # the median: read at the upper quartile and further out (the 90th percentile, or less far
    # in a short job, so that its own few spikes stay above the level read), the larger
    # scale, so that a bulk-plus-blips mixture reads as its tail.
    level = float(np.clip(1 - SPIKES_TOLERATED / len(x), 0.75, 0.9))
    median, upper, tail = np.quantile(x, [0.5, 0.75, level])
    scale = max((upper - median) / np.log(2), (tail - median) / np.log(0.5 / (1 - level)),
                config.noise_floor)
    reach = median + scale * np.log(len(x) / (2 * config.spike_alpha))
    return float(max(config.spike_ratio, np.exp(reach)))


def _own_parts(times: CollectiveTimes) -> dict[str, np.ndarray]:
    """The parts of each rank's step time that are its own doing (ranks x steps each; host
    time as ``CollectiveTimes.own_host_s`` says)."""
    return {"host": times.own_host_s, "idle": times.idle_s, "compute": times.compute_s,
            "communication": times.comm_s}


def _segment_delta(values: np.ndarray, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Per rank: median over the ``after`` steps minus median over the ``before`` steps."""
    return nanmedian(values[:, after], axis=1) - nanmedian(values[:, before], axis=1)


_CAUSE = {"host": "host", "idle": "host", "compute": "compute",
          "communication": "communication"}


def attribute(matrix: StepMatrix, l1: L1Result, times: CollectiveTimes,
              config: L1Config) -> list[Culprit]:
    """Ranks whose own time explains each spike and each regression."""
    parts = _own_parts(times)
    calm = l1.judged & ~l1.spike_mask
    culprits = []
    events = [(s, "spike") for s, _ in l1.spikes] + [(s, "blip") for s, _ in l1.blips]
    if events:
        base = {k: nanmedian(v[:, calm], axis=1) for k, v in parts.items()}
        for step, event in sorted(events):
            col = int(np.searchsorted(matrix.steps, step))
            excess_job = l1.iteration_s[col] - l1.baseline_s[col]
            deltas = {k: v[:, col] - base[k] for k, v in parts.items()}
            culprits += _culprits(matrix, deltas, base, excess_job, config, step, event, None)
    for (onset, _), (lo, cp, hi) in zip(l1.regressions, l1.segments, strict=True):
        before = np.zeros(len(matrix.steps), dtype=bool)
        after = np.zeros(len(matrix.steps), dtype=bool)
        before[lo:cp] = True
        after[cp:hi] = True
        before &= calm
        after &= calm
        excess_job = float(np.median(l1.iteration_s[after]) - np.median(l1.iteration_s[before]))
        deltas = {k: _segment_delta(v, before, after) for k, v in parts.items()}
        levels = {k: nanmedian(v[:, before], axis=1) for k, v in parts.items()}
        measured = _segment_delta(times.host_pre_s, before, after)  # steps with kernels
        deltas["host"] = np.where(np.isfinite(measured), measured, deltas["host"])
        levels["host"] = np.where(np.isfinite(measured),
                                  nanmedian(times.host_pre_s[:, before], axis=1), levels["host"])
        culprits += _culprits(matrix, deltas, levels, excess_job, config, onset, "regression",
                              int(matrix.steps[hi - 1]))
    return culprits


def _culprits(matrix: StepMatrix, deltas: dict[str, np.ndarray], levels: dict[str, np.ndarray],
              excess_job: float, config: L1Config, step: int, event: str,
              last: int | None) -> list[Culprit]:
    """Ranks whose rise in one part of their own time stands out from the other ranks' (a
    job of one rank: its own rise) by at least ``min_rise`` of the part's level before."""
    if not excess_job > 0 or len(matrix.ranks) < 1:
        return []
    needed = config.attribution_share * excess_job
    stand_out = {}
    for part, delta in deltas.items():
        delta = np.nan_to_num(delta)
        others = (0.0 if len(delta) == 1 else delta[::-1] if len(delta) == 2
                  else np.median(delta))
        rise = delta - others
        floor = (config.min_rise - 1) * np.nan_to_num(levels[part])
        stand_out[part] = np.where(rise >= floor, rise, -np.inf)
    names = list(stand_out)
    table = np.stack([stand_out[n] for n in names])  # parts x ranks
    best = np.argmax(table, axis=0)
    # One event, one cause: ranks whose rise is a consequence of the top culprit's (host
    # slack after finishing early, waiting folded into their own parts) rise less.
    top_cause = _CAUSE[names[int(np.argmax(table.max(axis=1)))]]
    out = []
    for r in np.flatnonzero(table.max(axis=0) >= needed).tolist():
        part = names[best[r]]
        if _CAUSE[part] != top_cause:
            continue
        out.append(Culprit(int(matrix.ranks[r]), step, _CAUSE[part],
                           float(np.nan_to_num(deltas[part][r])), event, last))
    return out
