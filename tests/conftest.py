"""Shared fixtures: simulated traces built in memory through the real schema parser."""

from __future__ import annotations

import orjson
import pytest

from argus_core.schema import parse_record
from argus_core.simulate import simulate
from argus_core.simulate.model import SimConfig
from argus_core.trace import Trace, TraceBuilder


def build_trace(config: SimConfig) -> Trace:
    """Simulate, round-trip every record through JSON and the schema parser, build the trace."""
    builder = TraceBuilder()
    for _, record in simulate(config):
        builder.add(parse_record(orjson.loads(orjson.dumps(
            record, option=orjson.OPT_SERIALIZE_NUMPY))))
    return builder.finish()[config.job]


@pytest.fixture
def trace_of():
    """Factory fixture: trace_of(SimConfig) -> Trace."""
    return build_trace
