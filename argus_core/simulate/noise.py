"""Step-level noise of real jobs, for the simulator: per-step jitter, slow drift and blips.

Real ranks are not the simulator's independent kernel jitter: a whole step of one rank runs
slower when the scheduler, the garbage collector or a busy core gets in the way (jitter, one
draw per rank and step), ranks drift for a few steps (an AR(1) log speed), and now and then one
step is far slower (a blip: at least 1.5x, half of them on the host before the step, half in
its compute). ``fit_noise`` reads the three from a healthy trace; ``REAL_CPU`` is what it reads
from the committed recordings of real torch DDP jobs on CPU (``tests/data/real_jobs``,
``tests/test_real_jobs.py`` checks it), the noisiest real jobs Argus is held to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.stats.robust import MAD_TO_SIGMA

BLIP_RATIO = 1.5  # a step this much slower than the rank's median is a blip


@dataclass(frozen=True)
class NoiseModel:
    """Step-level noise per rank (all zero: none)."""

    step_jitter: float = 0.0  # log-sd of a rank's compute time, one draw per rank and step
    drift: float = 0.0  # log-sd of a rank's slow drift (AR(1) over steps)
    drift_corr: float = 0.8  # the drift's step-to-step correlation (not fitted)
    blip_rate: float = 0.0  # share of (rank, step) that blip
    blip_excess: float = 0.0  # mean extra time of a blip beyond BLIP_RATIO, x the step

    def __post_init__(self) -> None:
        for name in ("step_jitter", "drift", "blip_rate", "blip_excess"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"noise {name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.drift_corr < 1:
            raise ValueError(f"noise drift_corr must be in [0, 1), got {self.drift_corr}")
        if self.blip_rate >= 0.5:
            raise ValueError(f"noise blip_rate must be < 0.5, got {self.blip_rate}")

    @property
    def active(self) -> bool:
        """Whether it adds anything."""
        return bool(self.step_jitter or self.drift or self.blip_rate)


# fit_noise over the healthy recordings of 2, 4 and 8 ranks (the 1-rank job is quieter).
REAL_CPU = NoiseModel(step_jitter=0.2, drift=0.1, blip_rate=0.05, blip_excess=0.25)


def fit_noise(own_s: np.ndarray) -> NoiseModel:
    """The noise of a healthy job from each rank's own time per step (ranks x steps, wall
    time less waiting in collectives; warm-up steps left out): blips are steps at least
    ``BLIP_RATIO`` over the rank's median, the drift is the spread of the 5-step rolling
    median of the other steps, the jitter the spread of their step-to-step differences."""
    own_s = np.asarray(own_s, dtype=np.float64)
    if own_s.ndim != 2 or own_s.shape[1] < 8:
        raise ValueError("fit_noise needs ranks x steps with at least 8 steps")
    d = np.log(np.maximum(own_s, 1e-9))
    d -= np.nanmedian(d, axis=1, keepdims=True)
    blip = d > np.log(BLIP_RATIO)
    excess = np.exp(d[blip]) - BLIP_RATIO
    calm = np.where(blip | np.isnan(d), 0.0, d)
    smooth = np.median(np.lib.stride_tricks.sliding_window_view(calm, 5, axis=1), axis=2)
    drift = MAD_TO_SIGMA * np.median(np.abs(smooth - np.median(smooth, axis=1, keepdims=True)))
    jitter = MAD_TO_SIGMA * np.median(np.abs(np.diff(calm, axis=1))) / np.sqrt(2)
    return NoiseModel(step_jitter=float(jitter), drift=float(drift),
                      blip_rate=float(blip.mean()),
                      blip_excess=float(excess.mean()) if len(excess) else 0.0)
