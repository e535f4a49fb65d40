"""Logging that cannot flood: repeated messages are rate-limited, with a count of what was held.

An attack or an outage repeats the same message many times (273,000 tracebacks, 190 MB of log
for one slow-loris flood). :class:`RateLimit` lets the first ``burst`` records of each
(logger, message, exception type) through per ``interval_s``, then holds the rest and adds
"(N similar suppressed)" to the next one that passes; a held record's traceback is never
formatted. ``rate_limited`` gives a module a logger of its own behind such a limit (the
upload spool's warnings, which a full disk or a dead store would repeat for every window).
"""

from __future__ import annotations

import logging
import threading
import time

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class RateLimit(logging.Filter):
    """A logging filter: at most ``burst`` records per ``interval_s`` for each kind of record."""

    def __init__(self, interval_s: float = 10.0, burst: int = 5, max_keys: int = 10_000,
                 clock=time.monotonic):
        super().__init__()
        self.clock = clock
        self.interval_s = interval_s
        self.burst = burst
        self.max_keys = max_keys
        self.suppressed = 0
        self._seen: dict[tuple, list] = {}  # key -> [window start, passed, held]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """Pass or hold one record."""
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, str(record.msg)[:200], exc)
        now = self.clock()
        with self._lock:
            slot = self._seen.get(key)
            if slot is None or now - slot[0] >= self.interval_s:
                held = slot[2] if slot else 0
                if len(self._seen) >= self.max_keys:
                    self._seen.clear()
                self._seen[key] = [now, 1, 0]
                if held:
                    record.msg = f"{record.msg} ({held} similar suppressed)"
                return True
            if slot[1] < self.burst:
                slot[1] += 1
                return True
            slot[2] += 1
            self.suppressed += 1
            return False


def rate_limited(logger: logging.Logger, interval_s: float = 30.0,
                 burst: int = 1) -> logging.Logger:
    """A child of ``logger`` that passes ``burst`` records of each kind per ``interval_s``
    and counts the rest into the next one, whatever handlers the process configured."""
    child = logger.getChild("limited")
    if not any(isinstance(f, RateLimit) for f in child.filters):
        child.addFilter(RateLimit(interval_s, burst))
    return child


def configure_logging(level: int = logging.INFO, limit: RateLimit | None = None,
                      root: logging.Logger | None = None) -> RateLimit:
    """Log to stderr as the processor does (``root``: the root logger), every handler behind
    one rate limit."""
    root = root or logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    limit = limit or RateLimit()
    for handler in root.handlers:
        if not any(isinstance(f, RateLimit) for f in handler.filters):
            handler.addFilter(limit)
    return limit
