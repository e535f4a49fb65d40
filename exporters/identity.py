"""Who this process is: job, rank, host and position on the parallel axes.

From torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE) plus ``ARGUS_JOB`` and
``ARGUS_COORDS`` (``dp=1,tp=0,pp=2``). Without ``ARGUS_COORDS`` every rank is a DP replica
(dp = rank), which is right for plain DDP.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from argus_exporters.config import ConfigError

AXES = ("dp", "tp", "pp", "ep")
MAX_RANK = 2**31 - 1  # schema v1's bounds: the processor refuses records beyond them
MAX_TEXT = 4096


@dataclass(frozen=True)
class RankIdentity:
    """This rank's identity, as carried by the schema's ``rank`` record and metric labels."""

    job: str
    rank: int
    world_size: int
    local_rank: int
    host: str
    coords: dict[str, int]
    coords_given: bool = False  # set by ARGUS_COORDS: never replaced by learned coordinates
    placement: dict = field(default_factory=dict)  # where it runs (placement.py); {}: unknown

    @classmethod
    def from_env(cls, env: dict | None = None) -> RankIdentity:
        """Identity from torchrun's and Argus's environment variables; raises ConfigError."""
        env = dict(os.environ if env is None else env)
        rank = _int(env, "RANK", 0)
        world = _int(env, "WORLD_SIZE", 1, MAX_RANK + 1)
        if not 0 <= rank < world:
            raise ConfigError(f"RANK={rank} is outside WORLD_SIZE={world}")
        coords = _coords(env.get("ARGUS_COORDS", ""), rank)
        job = _text(env, "ARGUS_JOB") or env.get("TORCHELASTIC_RUN_ID") or "default"
        return cls(job=job, rank=rank, world_size=world, local_rank=_int(env, "LOCAL_RANK", 0),
                   host=_text(env, "ARGUS_HOST") or socket.gethostname(), coords=coords,
                   coords_given=bool(env.get("ARGUS_COORDS", "").strip()))

    def labels(self) -> dict[str, str]:
        """Prometheus labels shared by every series of this rank (DESIGN.md)."""
        return {"job": self.job, "rank": str(self.rank), "host": self.host,
                **{axis: str(self.coords.get(axis, 0)) for axis in AXES}}


def _int(env: dict, name: str, default: int, maximum: int = MAX_RANK) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdecimal() or int(raw) > maximum:
        raise ConfigError(f"{name}={raw!r}: expected an integer from 0 to {maximum}")
    return int(raw)


def _text(env: dict, name: str) -> str | None:
    value = env.get(name)
    if value is not None and len(value) > MAX_TEXT:
        raise ConfigError(f"{name}: longer than {MAX_TEXT} characters ({len(value)})")
    return value


def _coords(text: str, rank: int) -> dict[str, int]:
    if not text.strip():
        return {"dp": rank, "tp": 0, "pp": 0, "ep": 0}
    coords = {axis: 0 for axis in AXES}
    for part in filter(None, (p.strip() for p in text.split(","))):
        axis, _, value = part.partition("=")
        if axis not in AXES or not value.isdecimal() or int(value) > MAX_RANK:
            raise ConfigError(f"ARGUS_COORDS part {part!r}: expected AXIS=N with AXIS in "
                              f"{', '.join(AXES)} and N from 0 to {MAX_RANK}")
        coords[axis] = int(value)
    return coords
