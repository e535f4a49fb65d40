"""What the tracer drives: a probe is told each completed step and shut down at exit, as an
OpenTelemetry processor is told each span. The kernel and stack probes are the built-in ones;
:class:`NoOpProbe` is the do-nothing default to build on."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Probe(Protocol):
    """An in-process probe: ``on_step`` runs on the training thread after every step (keep it
    to microseconds), ``shutdown`` once at exit; neither may raise into the caller."""

    def on_step(self, step: int, wall_s: float) -> None:
        """Step ``step`` just completed, taking ``wall_s`` seconds of wall time."""

    def shutdown(self, timeout: float) -> None:
        """Stop, flushing what is held, within ``timeout`` seconds."""


class NoOpProbe:
    """A probe that does nothing."""

    def on_step(self, step: int, wall_s: float) -> None:
        """Nothing to do after a step."""

    def shutdown(self, timeout: float) -> None:
        """Nothing to stop."""
