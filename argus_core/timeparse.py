"""The times and durations users type, parsed once for every command and service.

Durations are Prometheus's (``15s``, ``1h30m``, ``500ms``; a bare number is seconds). Instants
are ISO-8601 (UTC when no zone is given) or Unix seconds or milliseconds (12 or more digits:
milliseconds, as Grafana sends), between the years 1970 and 9999 (what the trace store's keys
hold). Bad text raises ValueError saying what is expected; callers add their own context (the
argument's name, an HTTP status).
"""

from __future__ import annotations

import calendar
import math
import re
from datetime import UTC, datetime
from decimal import Decimal

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
UNIT_S = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}

MAX_INSTANT_NS = (calendar.timegm((9999, 12, 31, 23, 59, 59)) + 1) * 1_000_000_000
"""An instant must be before the year 10000 (and not before 1970), like the store's keys."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_MS_DIGITS = 12  # 12+ digits: milliseconds (Grafana); fewer: seconds
_MAX_INSTANT_CHARS = 64
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")  # ASCII only: \d would take other scripts' digits


def parse_duration(value: str | float) -> float:
    """Seconds from a number or a Prometheus duration string (``90s``, ``1m30s``, ``500ms``);
    never infinite or NaN."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        if not _DURATION.match(text):
            raise ValueError(f"{value!r} is not a duration (expected e.g. 15s, 2m, 1h30m, "
                             "500ms)")
        seconds = sum(float(n) * UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    if not math.isfinite(seconds):
        raise ValueError(f"{str(value)[:40]!r} is not a duration: it is not finite")
    return seconds


def parse_instant(text: str) -> int:
    """Nanoseconds since the epoch of ``text``: ISO-8601 (UTC if no zone), Unix ms or s; exact
    (no float rounds the nanoseconds) and never outside the years 1970 to 9999."""
    value = text.strip()
    if len(value) > _MAX_INSTANT_CHARS:
        raise ValueError("too long for a time")
    if _NUMBER.fullmatch(value):
        whole = value.split(".")[0]
        scale = 1_000_000 if len(whole) >= _EPOCH_MS_DIGITS else 1_000_000_000
        at_ns = int(Decimal(value) * scale)
    else:
        at_ns = _iso_ns(value)
    if not 0 <= at_ns < MAX_INSTANT_NS:
        raise ValueError("outside the years 1970 to 9999")
    return at_ns


def _iso_ns(value: str) -> int:
    """Nanoseconds since the epoch of an ISO-8601 time (exact integer arithmetic)."""
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z"))
                                        else value)
    except ValueError:
        raise ValueError("use ISO-8601 (2026-11-29T19:00:00Z) or Unix milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH  # aware subtraction never leaves the calendar, unlike timestamp()
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1000
