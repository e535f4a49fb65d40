"""Slow point-to-point links, judged pair by pair (``argus_core.detect.links``).

Synthetic pipelines of four stages (send/recv per micro-batch, each message waited for at one
end by however late the other end is) over many seeds, and the recordings of real gloo
pipelines on CPU with a link slowed between two stages: a slow link is named by its two
ends, a late or slow stage is never a link.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from argus_core.detect.diagnose import diagnose
from argus_core.detect.l1 import detect_l1
from argus_core.detect.links import detect_links, link_times
from argus_core.detect.steps import step_matrix
from argus_core.reader import load_traces
from argus_core.schema import parse_record
from argus_core.trace import TraceBuilder

STAGES, MESSAGES, STEPS = 4, 4, 60
DATA = Path(__file__).parent / "data" / "real_jobs"


def _pipeline(seed: int, slow_link: tuple[int, int] | None = None, late_stage: int | None = None,
              onset: int = 30, extra_s: float = 0.002, one_end_only: bool = False):
    """A four-stage pipeline's trace: each message of a link takes ``x`` (lognormal noise
    around 0.5 ms); at each message one end waits for the other by a random skew (the
    pipeline's bubbles), more when ``late_stage`` arrives late from ``onset`` on. A
    ``slow_link`` (a, b) adds ``extra_s`` to every message between a and b, both ways."""
    rng = np.random.default_rng(seed)
    builder = TraceBuilder()
    for rank in range(STAGES):
        builder.add(parse_record({"v": 1, "kind": "rank", "job": "pp", "rank": rank,
                                  "world_size": STAGES, "coords": {"pp": rank}}))
    for step in range(STEPS):
        ends: dict[tuple[int, str, int], list[float]] = {}
        for a in range(STAGES - 1):
            for sender, receiver in ((a, a + 1), (a + 1, a)):
                for _ in range(MESSAGES):
                    x = 0.0005 * rng.lognormal(0.0, 0.2)
                    if slow_link and {sender, receiver} == set(slow_link) and step >= onset:
                        x += extra_s
                    skew = rng.exponential(0.002)  # one end arrives first and waits
                    if late_stage in (sender, receiver) and step >= onset:
                        skew += rng.uniform(0.0, 0.02)
                    sender_waits = (receiver == late_stage) if late_stage in (
                        sender, receiver) and step >= onset else rng.random() < 0.5
                    ends.setdefault((sender, "pp-send", receiver), []).append(
                        x + (skew if sender_waits else 0.0))
                    ends.setdefault((receiver, "pp-recv", sender), []).append(
                        x + (0.0 if sender_waits else skew))
        for rank in range(STAGES):
            mine = {(phase, peer): times for (r, phase, peer), times in ends.items()
                    if r == rank}
            phases: dict[str, float] = {"forward": 0.005}
            peers: dict[str, dict[str, dict]] = {}
            for (phase, peer), times in mine.items():
                if one_end_only and phase == "pp-recv":
                    continue
                phases[phase] = phases.get(phase, 0.0) + sum(times)
                peers.setdefault(phase, {})[str(peer)] = {"s": sum(times), "n": len(times),
                                                          "min_s": min(times)}
            for phase, by_peer in peers.items():  # a phase's time is every peer's
                phases[phase] = sum(v["s"] for v in by_peer.values())
            wall = sum(phases.values()) + 0.001
            builder.add(parse_record({"v": 1, "kind": "step", "job": "pp", "rank": rank,
                                      "step": step, "t_ns": 10**18 + step * 10**8,
                                      "wall_s": wall, "gpu_s": wall, "phases": phases,
                                      "peers": peers}))
    return builder.finish()["pp"]


def _links(trace):
    matrix = step_matrix(trace.steps)
    l1 = detect_l1(matrix)
    return detect_links(trace.steps, matrix, l1.judged & ~l1.spike_mask)


SEEDS = range(20)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_slow_link_is_found_by_its_two_ends_and_nothing_else(seed):
    """Every message between stages 1 and 2 takes 2 ms more from step 30 on: both
    directions of that link are found at their onset, no other link."""
    found = _links(_pipeline(seed, slow_link=(1, 2)))
    assert {(f.sender, f.receiver) for f in found if f.excess_s > 0.004} == {(1, 2), (2, 1)}
    for f in found:
        if {f.sender, f.receiver} == {1, 2}:
            assert abs(f.onset - 30) <= 1 and f.excess_s == pytest.approx(
                MESSAGES * 0.002, rel=0.3)
        else:  # whatever else moved costs nothing worth a verdict
            assert f.excess_s < 0.001


@pytest.mark.parametrize("seed", SEEDS)
def test_a_late_stage_is_never_a_slow_link(seed):
    """Stage 2 arrives up to 20 ms late at its messages from step 30 on: its neighbours
    wait inside their sends and recvs (their sums rise), but never both ends of one message,
    so no link's own time rises."""
    trace = _pipeline(seed, late_stage=2)
    assert not [f for f in _links(trace) if f.excess_s > 0.001]
    matrix = step_matrix(trace.steps)
    times = link_times(trace.steps, matrix)
    sends = matrix.phases[1, :, matrix.phase_names.index("pp-send")]  # stage 1 waits for 2
    assert np.sum(sends[30:]) > 2 * np.sum(sends[:30])
    assert np.nanmedian(times.seconds[:, 30:]) < 1.5 * np.nanmedian(times.seconds[:, :30])


def test_a_healthy_pipeline_has_no_slow_link():
    """Over many seeds, healthy links (bubbles, lognormal noise) are never found."""
    assert not [f for seed in SEEDS for f in _links(_pipeline(seed))]


def test_a_link_with_one_end_recorded_is_not_judged():
    """Only the senders name their peers: a link needs both ends, so nothing is judged."""
    trace = _pipeline(0, slow_link=(1, 2), one_end_only=True)
    assert np.isnan(link_times(trace.steps, step_matrix(trace.steps)).seconds).all()
    assert _links(trace) == []


def _recording(name: str):
    return next(iter(load_traces([DATA / name]).traces.values()))


@pytest.mark.parametrize(("name", "pair", "onset"), [
    ("pp4-link-4-run0.ndjson.gz", (1, 2), 10), ("pp4-link-4-run1.ndjson.gz", (1, 2), 10),
    ("pp4-link-4-late-run0.ndjson.gz", (0, 1), 30),
    ("pp4-link-4-late-run1.ndjson.gz", (0, 1), 30)])
def test_a_real_pipeline_names_its_slowed_link(name, pair, onset):
    """Real gloo pipelines (four stages on CPU) whose sends between two stages deliver
    late: both directions of that link found at the onset, both ends blamed with each other
    as peer, the suspect is the link between them, and no stage is called slow or late."""
    diagnosis = diagnose(_recording(name))
    doc = diagnosis.to_json()
    worth = {(f["from"], f["to"]) for f in doc["l2"]["links"] if f["cost_share"] >= 0.02}
    assert worth == {pair, pair[::-1]}
    for f in doc["l2"]["links"]:
        if (f["from"], f["to"]) in worth:
            assert abs(f["step"] - onset) <= 1 and f["ratio"] > 3
    assert {(v["rank"], v["cause"], v["peer"]) for v in doc["verdict"]} == {
        (pair[0], "communication", pair[1]), (pair[1], "communication", pair[0])}
    assert "link with rank" in doc["verdict"][0]["evidence"]
    assert [(s["unit_kind"], s["ranks"]) for s in doc["suspects"]] == [("link", list(pair))]


@pytest.mark.parametrize("name", ["pp4-healthy-4-run0.ndjson.gz", "pp4-late-4-run1.ndjson.gz",
                                  "pp4-slow-4-run0.ndjson.gz", "pp-late-4-run2.ndjson.gz"])
def test_a_real_pipeline_without_a_slow_link_has_no_link_worth_a_verdict(name):
    """Healthy, late-stage and slow-stage real pipelines record their peers too: whatever
    their links do costs less than the verdict floor."""
    doc = diagnose(_recording(name)).to_json()
    assert all(f["cost_share"] < 0.02 for f in doc["l2"]["links"])
    assert all("peer" not in v for v in doc["verdict"])


def test_a_link_that_slowed_while_the_job_did_not_costs_nothing():
    """A link's rise is what the job lost only when the job's step rose with it: with a
    flat iteration time (the link's time hidden behind other work) it is found but costs
    nothing, so it can make no verdict."""
    trace = _pipeline(3, slow_link=(1, 2))
    matrix = step_matrix(trace.steps)
    l1 = detect_l1(matrix)
    calm = l1.judged & ~l1.spike_mask
    flat = np.full(len(matrix.steps), 0.05)
    found = detect_links(trace.steps, matrix, calm, iteration_s=flat)
    slow = [f for f in found if {f.sender, f.receiver} == {1, 2}]
    assert len(slow) == 2 and all(f.excess_s > 0.004 and f.cost_s == 0.0 for f in slow)
    rising = detect_links(trace.steps, matrix, calm, iteration_s=l1.iteration_s)
    assert all(f.cost_s > 0.004 for f in rising if {f.sender, f.receiver} == {1, 2})
