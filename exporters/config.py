"""Settings of the in-process exporters, read once from ``ARGUS_*`` environment variables.

Everything is off unless ``ARGUS_ENABLED=1`` (or ``argus run`` sets it). Each probe can be
switched on its own. Defaults live in ``_DEFAULT_*`` constants and are checked here, so a bad
value fails at start-up with the variable's name, never later inside training.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

_DEFAULT_SINK = "file:///tmp/argus-spool"
_DEFAULT_QUEUE_RECORDS = 4096
_DEFAULT_BATCH_RECORDS = 256
_DEFAULT_FLUSH_S = 2.0
_DEFAULT_FILE_MAX_BYTES = 64 << 20  # per spool file, then rotate
_DEFAULT_SPOOL_MAX_BYTES = 1 << 30  # per rank, oldest files deleted beyond it
_DEFAULT_HTTP_TIMEOUT_S = 2.0
_DEFAULT_HTTP_RETRY_S = 30.0  # waits one batch may spend on a busy (429/503) receiver
_DEFAULT_WINDOW_STEPS = 32  # rolling-window gauges cover the last N steps
_DEFAULT_PENDING_STEPS = 256  # closed steps awaiting resolution (CUDA events in flight)
_DEFAULT_KERNEL_DUTY = 0  # trace 1 step in N; 0 = auto (kernels/duty.py)
_DEFAULT_KERNEL_BUDGET = 0.01  # auto duty: CUPTI's estimated cost, share of step time
_DEFAULT_KERNEL_BUFFER_BYTES = 8 << 20
_DEFAULT_KERNEL_BUFFERS = 8
_DEFAULT_KERNEL_FLUSH_S = 1.0
_DEFAULT_KERNEL_CALLBACKS = "auto"  # torch's native CUPTI callbacks if torch has them, else shim
_KERNEL_CALLBACKS = ("auto", "torch", "shim")
_DEFAULT_STACK_PERIOD_S = 30.0
_DEFAULT_STACK_SPIKE_RATIO = 2.0
_DEFAULT_PLACEMENT = True  # from the environment; a Settings built in code asks for it
_MAX_SECONDS = 86_400.0  # periods and timeouts: a day (timers overflow far beyond)
_MAX_COUNT = 2**62  # counts and sizes: what a deque's maxlen and file offsets can hold
_MAX_PORT = 65_535


class ConfigError(ValueError):
    """An ``ARGUS_*`` variable holds a value that cannot be used."""


def _flag(env: dict, name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: expected 1/0, true/false, yes/no or on/off")


def _number(env: dict, name: str, default: float, kind: type = float, minimum: float = 0,
            maximum: float | None = None) -> float:
    """A finite number in [minimum, maximum] (seconds up to a day, counts up to 2**62 unless
    told), or the default when unset; raises ConfigError naming the variable."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a {kind.__name__}") from None
    if maximum is None:
        maximum = _MAX_COUNT if kind is int else _MAX_SECONDS
    if not math.isfinite(value):
        raise ConfigError(f"{name}={raw!r}: expected a finite number")
    if value < minimum:
        raise ConfigError(f"{name}={raw!r}: must be >= {minimum}")
    if value > maximum:
        raise ConfigError(f"{name}={raw!r}: must be <= {maximum:g}")
    return value


def _duty(env: dict) -> int:
    """ARGUS_KERNEL_DUTY: ``auto`` (0) or a whole number of steps >= 1."""
    raw = (env.get("ARGUS_KERNEL_DUTY") or "").strip()
    if raw.lower() in ("", "auto"):
        return _DEFAULT_KERNEL_DUTY
    return int(_number({"ARGUS_KERNEL_DUTY": raw}, "ARGUS_KERNEL_DUTY", 1, int, 1))


def _choice(env: dict, name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return value


@dataclass(frozen=True)
class Settings:
    """What the exporters do in this process."""

    enabled: bool = False
    sink: str = _DEFAULT_SINK
    phases: bool = True
    collectives: bool = True  # every torch.distributed collective timed (collectives.py)
    native_hooks: bool = True  # the collective hooks' wrappers in C where they build (hooks.c)
    kernels: bool = False  # CUPTI: off unless asked for
    stacks: bool = False  # py-spy: off unless asked for
    metrics_port: int | None = None  # base port; the rank listens on base + local_rank
    metrics_addr: str = "127.0.0.1"  # loopback: ARGUS_METRICS_ADDR=0.0.0.0 for a remote scraper
    queue_records: int = _DEFAULT_QUEUE_RECORDS
    batch_records: int = _DEFAULT_BATCH_RECORDS
    flush_s: float = _DEFAULT_FLUSH_S
    file_max_bytes: int = _DEFAULT_FILE_MAX_BYTES
    spool_max_bytes: int = _DEFAULT_SPOOL_MAX_BYTES
    http_timeout_s: float = _DEFAULT_HTTP_TIMEOUT_S
    http_retry_s: float = _DEFAULT_HTTP_RETRY_S
    window_steps: int = _DEFAULT_WINDOW_STEPS
    pending_steps: int = _DEFAULT_PENDING_STEPS
    kernel_duty: int = _DEFAULT_KERNEL_DUTY
    kernel_budget: float = _DEFAULT_KERNEL_BUDGET
    kernel_buffer_bytes: int = _DEFAULT_KERNEL_BUFFER_BYTES
    kernel_buffers: int = _DEFAULT_KERNEL_BUFFERS
    kernel_flush_s: float = _DEFAULT_KERNEL_FLUSH_S
    kernel_callbacks: str = _DEFAULT_KERNEL_CALLBACKS
    stack_period_s: float = _DEFAULT_STACK_PERIOD_S
    stack_spike_ratio: float = _DEFAULT_STACK_SPIKE_RATIO
    otel: bool = True  # phases as spans when the application has a tracer provider
    # where the rank runs (GPU, NIC, switch, rack: placement.py), found off the training
    # thread: on from the environment unless ARGUS_PLACEMENT=0; off in a Settings built in
    # code (tests, benches, the simulator's ranks, all on one host), which ask for it
    placement: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict | None = None) -> Settings:
        """Read ``ARGUS_*`` variables (``os.environ`` by default); raises ConfigError."""
        env = dict(os.environ if env is None else env)
        port = env.get("ARGUS_METRICS_PORT")
        return cls(
            enabled=_flag(env, "ARGUS_ENABLED", False),
            sink=env.get("ARGUS_SINK") or _DEFAULT_SINK,
            phases=_flag(env, "ARGUS_PHASES", True),
            collectives=_flag(env, "ARGUS_COLLECTIVES", True),
            native_hooks=_flag(env, "ARGUS_NATIVE_HOOKS", True),
            kernels=_flag(env, "ARGUS_KERNELS", False),
            stacks=_flag(env, "ARGUS_STACKS", False),
            metrics_port=(int(_number(env, "ARGUS_METRICS_PORT", 0, int, 1, _MAX_PORT))
                          if port else None),
            metrics_addr=env.get("ARGUS_METRICS_ADDR") or "127.0.0.1",
            queue_records=int(_number(env, "ARGUS_QUEUE_RECORDS", _DEFAULT_QUEUE_RECORDS, int, 1)),
            batch_records=int(_number(env, "ARGUS_BATCH_RECORDS", _DEFAULT_BATCH_RECORDS, int, 1)),
            flush_s=_number(env, "ARGUS_FLUSH_S", _DEFAULT_FLUSH_S, float, 0.01),
            file_max_bytes=int(_number(env, "ARGUS_FILE_MAX_BYTES", _DEFAULT_FILE_MAX_BYTES, int,
                                       1024)),
            spool_max_bytes=int(_number(env, "ARGUS_SPOOL_MAX_BYTES", _DEFAULT_SPOOL_MAX_BYTES,
                                        int, 1024)),
            http_timeout_s=_number(env, "ARGUS_HTTP_TIMEOUT_S", _DEFAULT_HTTP_TIMEOUT_S, float,
                                   0.01),
            http_retry_s=_number(env, "ARGUS_HTTP_RETRY_S", _DEFAULT_HTTP_RETRY_S, float, 0),
            window_steps=int(_number(env, "ARGUS_WINDOW_STEPS", _DEFAULT_WINDOW_STEPS, int, 1)),
            pending_steps=int(_number(env, "ARGUS_PENDING_STEPS", _DEFAULT_PENDING_STEPS, int, 1)),
            kernel_duty=_duty(env),
            kernel_budget=_number(env, "ARGUS_KERNEL_BUDGET", _DEFAULT_KERNEL_BUDGET, float,
                                  1e-4, 1.0),
            kernel_buffer_bytes=int(_number(env, "ARGUS_KERNEL_BUFFER_BYTES",
                                            _DEFAULT_KERNEL_BUFFER_BYTES, int, 4096)),
            kernel_buffers=int(_number(env, "ARGUS_KERNEL_BUFFERS", _DEFAULT_KERNEL_BUFFERS, int,
                                       2)),
            kernel_flush_s=_number(env, "ARGUS_KERNEL_FLUSH_S", _DEFAULT_KERNEL_FLUSH_S, float,
                                   0.01),
            kernel_callbacks=_choice(env, "ARGUS_KERNEL_CALLBACKS", _DEFAULT_KERNEL_CALLBACKS,
                                     _KERNEL_CALLBACKS),
            stack_period_s=_number(env, "ARGUS_STACK_PERIOD_S", _DEFAULT_STACK_PERIOD_S, float,
                                   0.1),
            stack_spike_ratio=_number(env, "ARGUS_STACK_SPIKE_RATIO", _DEFAULT_STACK_SPIKE_RATIO,
                                      float, 1.0, 1e6),
            otel=_flag(env, "ARGUS_OTEL", True),
            placement=_flag(env, "ARGUS_PLACEMENT", _DEFAULT_PLACEMENT),
        )
