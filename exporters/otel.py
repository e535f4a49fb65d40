"""Argus phases as OpenTelemetry spans, when the application has a tracer provider.

Only ``opentelemetry-api`` is touched, and only if it is importable: with no SDK configured the
global provider is the API's proxy/no-op and nothing is created. A step becomes a span
``argus.step`` with one child span per phase, at their real (device-derived) times, carrying
the rank's identity as attributes, so Argus phases line up with the user's own traces.
"""

from __future__ import annotations

from argus_exporters.identity import RankIdentity


class SpanEmitter:
    """Creates spans for resolved steps; a no-op without a configured tracer provider."""

    def __init__(self, identity: RankIdentity):
        self.attributes = {"argus.job": identity.job, "argus.rank": identity.rank,
                           "host.name": identity.host,
                           **{f"argus.{k}": v for k, v in identity.coords.items()}}
        try:
            from opentelemetry import trace
        except ImportError:
            self._trace = None
        else:
            self._trace = trace

    def _tracer(self):
        if self._trace is None:
            return None
        provider = self._trace.get_tracer_provider()
        if isinstance(provider, self._trace.ProxyTracerProvider | self._trace.NoOpTracerProvider):
            return None
        return provider.get_tracer("argus_exporters")

    def active(self) -> bool:
        """Whether a tracer provider is configured (checked per step: apps set it late)."""
        return self._tracer() is not None

    def emit(self, step: int, t_ns: int, wall_s: float, first_epoch_ns: int,
             phases: list[tuple[str, float, float]]) -> None:
        """One step span and its phase spans; ``phases`` holds (name, offset_s, duration_s)
        with offsets from the step's first mark, taken at host time ``first_epoch_ns``."""
        tracer = self._tracer()
        if tracer is None:
            return
        root = tracer.start_span("argus.step", start_time=t_ns,
                                 attributes={**self.attributes, "argus.step": step})
        context = self._trace.set_span_in_context(root)
        for name, offset_s, duration_s in phases:
            start = first_epoch_ns + int(offset_s * 1e9)
            span = tracer.start_span(f"argus.phase.{name}", context=context, start_time=start,
                                     attributes={"argus.phase": name, "argus.step": step})
            span.end(end_time=start + int(duration_s * 1e9))
        root.end(end_time=t_ns + int(wall_s * 1e9))
