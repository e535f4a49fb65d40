"""The exporters' HTTP sink against receivers that never finish answering: every post ends by
its deadline, at most MAX_ANSWER_BYTES of an answer are read, shutdown returns in its bound.

Real sockets on loopback: a receiver that answers 200 and then trickles its body a byte at a
time, one whose answer is 1 GiB long, and one whose chunked answer never ends. The training
process must be able to exit and its memory must not follow the answer.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from argus_exporters.config import Settings
from argus_exporters.sinks.http import MAX_ANSWER_BYTES

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # the bench's own imports (_report)
_spec = importlib.util.spec_from_file_location("sink_bounds", BENCH / "sink_bounds.py")
sink_bounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sink_bounds)
HostileReceiver = sink_bounds.HostileReceiver
IDENTITY = sink_bounds.IDENTITY
TIMEOUT_S = sink_bounds.TIMEOUT_S


@pytest.mark.parametrize("mode", ["trickle", "huge", "endless"])
def test_a_receiver_that_never_finishes_cannot_hold_training(mode):
    """Steps go on at their own pace, memory does not follow the answer, and shutdown returns
    within its bound (flush timeout + join timeout + one post deadline)."""
    receiver = HostileReceiver(mode)
    try:
        result = sink_bounds.run(receiver.port, 40)
    finally:
        receiver.close()
    assert result["shutdown_s"] < 1.0 + 1.0 + TIMEOUT_S + 1.0  # plus slack
    assert result["max_step_ms"] < 500  # the training thread never waits for the receiver
    assert result["rss_growth_mb"] < 50  # at most MAX_ANSWER_BYTES of each answer were read
    assert receiver.sent > MAX_ANSWER_BYTES or mode == "trickle"
    assert result["shipped"] + sum(result["dropped"].values()) > 0


def test_a_trickling_answer_costs_at_most_one_post_deadline():
    """One post to a receiver that says 200 and then trickles its answer ends within
    ``http_timeout_s`` (a per-read timeout would wait forever: each byte arrives in time);
    the batch counts as delivered (the receiver said so), the connection is not kept."""
    from argus_exporters.health import Health
    from argus_exporters.sinks.http import HttpSink

    receiver = HostileReceiver("trickle")
    try:
        sink = HttpSink(Settings(enabled=True, sink=f"http://127.0.0.1:{receiver.port}/v1",
                                 http_timeout_s=TIMEOUT_S, http_retry_s=0.0), IDENTITY, Health())
        t0 = time.perf_counter()
        delivered = sink.export([b'{"v":1}\n'])
        took = time.perf_counter() - t0
        sink.shutdown()
    finally:
        receiver.close()
    assert delivered and sink._conn is None
    assert took < TIMEOUT_S + 1.0
