"""The one parser of typed times and durations (``argus_core.timeparse``), used by the rules
config, the trace links, ``argus traces`` and ``argus dashboards --check``."""

from __future__ import annotations

import pytest

from argus_core.timeparse import MAX_INSTANT_NS, parse_duration, parse_instant


@pytest.mark.parametrize("text, seconds", [
    ("15s", 15.0), ("2m", 120.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5h", 5400.0),
    ("1d", 86400.0), (90, 90.0), (0.25, 0.25),
])
def test_durations_are_prometheus_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "soon", "5 m", "-1m", "1m1", True,
                                  "9" * 400 + "s", float("inf"), float("nan")])
def test_anything_else_is_no_duration(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text, ns", [
    ("1790000012345", 1_790_000_012_345_000_000),  # Unix ms (Grafana)
    ("1790000012.000000001", 1_790_000_012_000_000_001),  # exact, no float rounding
    ("2026-09-21T14:13:32Z", 1_790_000_012_000_000_000),
    ("2026-09-21T14:13:32", 1_790_000_012_000_000_000),  # no zone: UTC
    ("2026-09-21T16:13:32+02:00", 1_790_000_012_000_000_000),
    ("1970-01-01T00:00:00Z", 0),
])
def test_instants(text, ns):
    assert parse_instant(text) == ns


@pytest.mark.parametrize("text, message", [
    ("yesterday", "ISO-8601"), ("1" * 30, "outside the years 1970 to 9999"),
    ("1969-12-31T23:59:59Z", "outside the years"), ("9" * 65, "too long"),
    ("١٢٣", "ISO-8601"),  # other scripts' digits are not Unix time
])
def test_bad_instants_say_what_is_expected(text, message):
    with pytest.raises(ValueError, match=message):
        parse_instant(text)


def test_the_last_instant_is_the_end_of_year_9999():
    assert parse_instant("9999-12-31T23:59:59.999999Z") < MAX_INSTANT_NS
