"""L1: the job's iteration time. Rare spikes (jitter) and sustained regressions (change points).

Synchronous training runs at the speed of its slowest rank, so L1 looks at one series: the max
over ranks of each step's wall time. (Per-rank L1 on synchronised step times would flag every
rank at once.) Spikes are steps far above the centred rolling median; regressions are shifts of
the log iteration time found by binary segmentation, after spikes are replaced by that median.
Spikes are then attributed to ranks: a rank whose host time (wall - GPU) jumped while its GPU
time did not is stalled on the host (paper case 4); one whose compute time jumped is a
transient compute straggler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus_core.detect.steps import StepMatrix
from argus_core.stats.changepoint import change_points, noise_scale
from argus_core.stats.robust import nanmedian
from argus_core.taxonomy import is_comm_phase


@dataclass(frozen=True)
class L1Config:
    """Thresholds of the iteration-time checks."""

    warmup_steps: int = 2  # first steps (compilation, cache warm-up) are not judged
    spike_ratio: float = 1.5  # a spike is this much above the rolling median
    window: int = 9  # rolling median window, in steps (centred)
    min_regression: float = 1.1  # a regression slows the job by at least 10%
    change_threshold: float = 6.0  # CUSUM statistic, in noise standard deviations
    min_segment: int = 3  # steps on each side of a change point
    noise_floor: float = 0.003  # log-scale noise never assumed below 0.3%
    attribution_share: float = 0.5  # a culprit explains at least half of a spike's excess


@dataclass
class SpikeCulprit:
    """A rank that explains a spike, and why."""

    rank: int
    step: int
    cause: str  # host or compute
    excess_s: float  # extra host (or compute) time at the spike


@dataclass
class L1Result:
    """Iteration-time series and what was found in it."""

    steps: np.ndarray
    iteration_s: np.ndarray
    baseline_s: np.ndarray  # centred rolling median
    judged: np.ndarray  # bool per step: past warm-up and recorded
    spikes: list[tuple[int, float]] = field(default_factory=list)  # (step, ratio)
    regressions: list[tuple[int, float]] = field(default_factory=list)  # (onset step, ratio)
    culprits: list[SpikeCulprit] = field(default_factory=list)

    @property
    def spike_mask(self) -> np.ndarray:
        """Bool per step: the step is a spike."""
        return np.isin(self.steps, [s for s, _ in self.spikes])

    @property
    def steady_mask(self) -> np.ndarray:
        """Steps L2 and L3 analyse: judged, not spikes, and after the last regression onset."""
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


def detect_l1(matrix: StepMatrix, config: L1Config | None = None) -> L1Result:
    """Spikes and regressions of the job's iteration time (max wall time over ranks)."""
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
    result.spikes = [(int(s), float(r)) for s, r in zip(matrix.steps[spike], ratio[spike],
                                                         strict=True)]

    # Regressions on the log series with spikes flattened to the local median.
    idx = np.flatnonzero(judged)
    y = np.log(np.where(spike, baseline, series)[idx])
    sigma = noise_scale(y, config.noise_floor)
    cps = change_points(y, config.change_threshold, config.min_segment,
                        np.log(config.min_regression), sigma)
    bounds = [0, *cps, len(y)]
    for i, cp in enumerate(cps):
        before = np.median(y[bounds[i]:cp])
        after = np.median(y[cp:bounds[i + 2]])
        ratio_cp = float(np.exp(after - before))
        if ratio_cp >= config.min_regression:
            result.regressions.append((int(matrix.steps[idx[cp]]), ratio_cp))
    result.culprits = _attribute_spikes(matrix, result, config)
    return result


def _attribute_spikes(matrix: StepMatrix, l1: L1Result, config: L1Config) -> list[SpikeCulprit]:
    """Ranks whose own host or compute time explains each spike."""
    if not l1.spikes:
        return []
    calm = l1.judged & ~l1.spike_mask
    host = matrix.wall - matrix.gpu
    compute_cols = [i for i, n in enumerate(matrix.phase_names) if not is_comm_phase(n)]
    compute = np.nansum(matrix.phases[:, :, compute_cols], axis=2) if compute_cols else None
    culprits = []
    host_base = nanmedian(host[:, calm], axis=1)
    compute_base = nanmedian(compute[:, calm], axis=1) if compute is not None else None
    for step, _ in l1.spikes:
        col = int(np.searchsorted(matrix.steps, step))
        excess_job = l1.iteration_s[col] - l1.baseline_s[col]
        needed = config.attribution_share * excess_job
        found = False
        for cause, values, base in (("host", host, host_base), ("compute", compute, compute_base)):
            if values is None:
                continue
            excess = values[:, col] - base
            hit = np.flatnonzero(np.nan_to_num(excess) >= needed)
            culprits += [SpikeCulprit(int(matrix.ranks[r]), step, cause, float(excess[r]))
                         for r in hit]
            found = found or len(hit) > 0
            if found:
                break
    return culprits
