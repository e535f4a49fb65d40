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

from argus_exporters.clock import HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.sinks.http import MAX_ANSWER_BYTES
from argus_exporters.tracer import Tracer

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # the bench's own imports (_report)
_spec = importlib.util.spec_from_file_location("sink_bounds", BENCH / "sink_bounds.py")
sink_bounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sink_bounds)
HostileReceiver = sink_bounds.HostileReceiver
IDENTITY = RankIdentity("job", 0, 1, 0, "node-0", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
TIMEOUT_S = 0.5


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        import os

        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("mode", ["trickle", "huge", "endless"])
def test_a_receiver_that_never_finishes_cannot_hold_training(mode):
    """Steps go on at their own pace, memory does not follow the answer, and shutdown returns
    within its bound (flush timeout + join timeout + one post deadline)."""
    receiver = HostileReceiver(mode)
    rss0 = _rss_mb()
    try:
        tracer = Tracer(Settings(enabled=True, sink=f"http://127.0.0.1:{receiver.port}/v1",
                                 flush_s=0.05, http_timeout_s=TIMEOUT_S, http_retry_s=0.0),
                        IDENTITY, clock=HostClock())
        slowest = 0.0
        for _ in range(40):
            t0 = time.perf_counter()
            with tracer.phase("forward"):
                time.sleep(0.005)
            tracer.step()
            slowest = max(slowest, time.perf_counter() - t0)
            time.sleep(0.02)
        t0 = time.perf_counter()
        tracer.shutdown(timeout=1.0)
        took = time.perf_counter() - t0
    finally:
        receiver.close()
    assert took < 1.0 + 1.0 + TIMEOUT_S + 1.0  # flush + join + one post, plus slack
    assert slowest < 0.5  # the training thread never waits for the receiver
    assert _rss_mb() - rss0 < 50  # at most MAX_ANSWER_BYTES of each answer were read
    assert receiver.sent > MAX_ANSWER_BYTES or mode == "trickle"
    health = tracer.health
    assert health.records_shipped + sum(health.dropped.values()) > 0


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
