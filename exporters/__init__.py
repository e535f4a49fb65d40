"""Argus exporters: in-process probes for training ranks (importable as ``argus_exporters``).

One line in a training script::

    import argus_exporters
    argus_exporters.instrument(model, optimizer)      # forward, backward, optimizer, steps

(every torch.distributed collective is timed as ``{axis}-{op}``, FSDP's, tensor and pipeline
parallelism's included, and a ``DistributedDataParallel`` model's gradient all-reduce through a
comm hook Argus registers), plus, where wanted, ``with argus_exporters.phase("mlp"): ...`` for
custom phases. Or no code change at all: ``argus run -- torchrun ... train.py``. Everything is
off unless ``ARGUS_ENABLED=1``; off, every call is a no-op. Nothing here ever raises into
training: a bad setting is logged and Argus stays off.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from typing import Any

from argus_exporters import collectives, hooks
from argus_exporters.config import ConfigError, Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import NoOpTracer, Tracer

__all__ = ["ddp_comm_hook", "end_when_done", "get_tracer", "instrument", "phase",
           "register_group", "shutdown", "start", "step"]

logger = logging.getLogger("argus_exporters")
_lock = threading.Lock()
_tracer: Tracer | NoOpTracer = NoOpTracer()
_started = False


def get_tracer() -> Tracer | NoOpTracer:
    """The process's tracer (a NoOpTracer until ``start`` enables Argus)."""
    return _tracer


def start(settings: Settings | None = None, identity: RankIdentity | None = None,
          **tracer_args: Any) -> Tracer | NoOpTracer:
    """Start Argus in this process once, from ``ARGUS_*`` variables unless given settings."""
    global _tracer, _started
    with _lock:
        if _started:
            return _tracer
        _started = True
        try:
            settings = settings or Settings.from_env()
            if not settings.enabled:
                return _tracer
            identity = identity or RankIdentity.from_env()
            tracer = Tracer(settings, identity, **tracer_args)
        except ConfigError as exc:
            logger.error("argus: disabled, bad configuration: %s", exc)
            return _tracer
        except Exception:  # never take training down: it goes on untraced
            logger.exception("argus: disabled, the exporters could not start")
            return _tracer
        _start_probes(tracer, settings, identity)
        _tracer = tracer
        atexit.register(shutdown)
        return tracer


def _start_probes(tracer: Tracer, settings: Settings, identity: RankIdentity) -> None:
    if settings.metrics_port is not None:
        from argus_exporters.metrics import serve

        serve(tracer.metrics, settings.metrics_port + identity.local_rank,
              settings.metrics_addr, tracer.health)
    if settings.kernels:
        from argus_exporters.kernels import KernelProbe

        probe = KernelProbe(settings, identity, tracer.emit, tracer.health)
        if probe.start():
            probe.step_begin(0)
            tracer.probes.append(probe)
    if settings.stacks:
        from argus_exporters.stacks import StackProbe

        stacks = StackProbe(settings, identity, tracer.emit, tracer.health)
        if stacks.start():
            tracer.probes.append(stacks)


def instrument(model: Any, optimizer: Any = None) -> list[Any]:
    """Start Argus (if enabled) and time forward, backward and optimizer of ``model``.

    A ``DistributedDataParallel`` model's gradient communication is timed too
    (``dp-allreduce``): Argus registers DDP's default all-reduce as a timed comm hook, or
    times the hook the application registers afterwards; one registered before is left as
    is (logged).
    """
    return hooks.instrument(model, optimizer, start())


def register_group(group: Any, axis: str) -> None:
    """Name ``group``'s collectives ``{axis}-{op}`` (``tp-allreduce``) and, unless
    ``ARGUS_COORDS`` is set, take this rank's rank in ``group`` as its coordinate on ``axis``.

    For groups that no named ``DeviceMesh`` dimension describes (Megatron-style
    ``new_group`` calls): ``register_group(tp_group, "tp")``.
    """
    timing = collectives.install(start())
    if timing is not None:
        timing.register(group, axis)


def phase(name: str, stream: Any = None) -> contextlib.AbstractContextManager:
    """``with argus_exporters.phase("mlp"):``: time a block as a phase of the current step.

    Communication phases are named ``{axis}-{op}`` (``tp-allreduce``) and given the stream the
    collective runs on.
    """
    return _tracer.phase(name, stream)


def step() -> None:
    """Close the current step by hand (``instrument`` does it after each optimizer step)."""
    _tracer.step()


def ddp_comm_hook(hook: Any = None, phase_name: str = "dp-allreduce"):
    """A DDP communication hook (default all-reduce) timed as ``phase_name``: for a hook
    registered before ``instrument``, or without it."""
    return hooks.ddp_comm_hook(start(), hook, phase_name)


def end_when_done(token: Any, work: Any) -> Any:
    """End a phase begun with ``get_tracer().begin_phase`` when async ``work`` completes."""
    return hooks.end_when_done(_tracer, token, work)


def shutdown(timeout: float = 5.0) -> None:
    """Flush and stop (also registered with atexit)."""
    _tracer.shutdown(timeout)
