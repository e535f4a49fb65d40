"""The exporters' own health: drops by reason, bytes shipped, probe states, self CPU time.

Every component reports here instead of raising into the training loop; the metrics endpoint
exposes it, and each state change of a probe is logged once.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

logger = logging.getLogger("argus_exporters")


class Health:
    """Thread-safe counters shared by the shipper, sinks and probes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: Counter[str] = Counter()  # records dropped, by reason
        self.records_shipped = 0
        self.bytes_shipped = 0
        self.export_failures = 0
        self.http_retries: Counter[str] = Counter()  # retried HTTP answers, by status
        self.cpu_seconds = 0.0  # exporter work on the training thread and its own threads
        self.steps = 0
        self.probes: dict[str, tuple[str, str]] = {}  # probe -> (state, reason)
        self.gauges: dict[str, tuple[str, float]] = {}  # metric name -> (help, value)

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` records dropped for ``reason`` (queue_full, sink_error, spool_full...)."""
        with self._lock:
            first = n > 0 and self.dropped[reason] == 0  # the first record dropped for it
            self.dropped[reason] += n
        if first:
            logger.warning("argus: dropping records (%s); counted in "
                           "argus_exporter_dropped_records_total", reason)

    def shipped(self, records: int, nbytes: int) -> None:
        """Count a successful export."""
        with self._lock:
            self.records_shipped += records
            self.bytes_shipped += nbytes

    def failed_export(self) -> None:
        """Count one failed export attempt."""
        with self._lock:
            self.export_failures += 1

    def http_retry(self, status: int | str) -> None:
        """Count one retry of a batch after a busy answer (429, 503) from the receiver, or
        after it could not be reached (``"connection"``: restarting)."""
        with self._lock:
            self.http_retries[str(status)] += 1

    def add_cpu(self, seconds: float) -> None:
        """Add exporter CPU time (measured with thread/process CPU clocks)."""
        with self._lock:
            self.cpu_seconds += seconds

    def set_gauge(self, name: str, help_text: str, value: float) -> None:
        """Set a probe's own gauge (e.g. the CUPTI clock offset), exposed as ``name``."""
        with self._lock:
            self.gauges[name] = (help_text, float(value))

    def probe_state(self, probe: str, state: str, reason: str = "") -> None:
        """Record a probe's state (on, off, unavailable...); log once per change."""
        with self._lock:
            changed = self.probes.get(probe) != (state, reason)
            self.probes[probe] = (state, reason)
        if changed:
            level = logging.INFO if state == "on" else logging.WARNING
            logger.log(level, "argus: %s probe %s%s", probe, state, f": {reason}" if reason else "")
