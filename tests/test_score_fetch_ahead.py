"""The scorer's round fetches the next jobs on a thread while it judges one
(``service.fetched_ahead``): the jobs come in order, each with its own failure, at most
``ahead`` fetched beyond the one being judged, and nothing left running when the round ends."""

from __future__ import annotations

import threading

import pytest

from argus_core.score.service import fetched_ahead

JOBS = [f"job-{i}" for i in range(8)]


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_jobs_come_in_order_each_with_its_own_failure(ahead):
    def fetch(job: str) -> str:
        if job == "job-3":
            raise ValueError("job-3's engine said no")
        return f"snapshot of {job}"

    with fetched_ahead(JOBS, fetch, ahead, threading.Event()) as fetched:
        out = list(fetched)
    assert [job for job, _, _ in out] == JOBS
    assert [snapshot for _, snapshot, _ in out] == [
        None if job == "job-3" else f"snapshot of {job}" for job in JOBS]
    (error,) = [e for _, _, e in out if e is not None]
    assert isinstance(error, ValueError) and "job-3" in str(error)


@pytest.mark.parametrize("jobs", [[], ["job-0"]])
def test_a_round_of_one_job_or_none_starts_no_thread(jobs):
    """Nothing to overlap: the job is fetched on the round's own thread."""
    fetched_on = []

    def fetch(job: str) -> str:
        fetched_on.append(threading.current_thread())
        return f"snapshot of {job}"

    with fetched_ahead(jobs, fetch, 1, threading.Event()) as fetched:
        assert not any(t.name == "argus-score-fetch" for t in threading.enumerate())
        out = list(fetched)
    assert [(job, snapshot) for job, snapshot, _ in out] == [(j, f"snapshot of {j}")
                                                           for j in jobs]
    assert fetched_on == [threading.current_thread()] * len(jobs)


@pytest.mark.parametrize("ahead", [1, 2])
def test_at_most_ahead_jobs_are_fetched_beyond_the_one_judged(ahead):
    """Each job fetched ahead is held in memory until judged: while the consumer judges job
    k, at most k + 1 + ``ahead`` jobs have been fetched (the one judged, ``ahead`` waiting,
    one more in hand waiting for room)."""
    fetched_jobs: list[str] = []
    started = threading.Event()

    def fetch(job: str) -> str:
        fetched_jobs.append(job)
        started.set()
        return job

    with fetched_ahead(JOBS, fetch, ahead, threading.Event()) as fetched:
        for k, (job, _, _) in enumerate(fetched):
            # give the fetching thread every chance to run ahead: it blocks on the bound
            assert started.wait(10)
            for _ in range(50):
                if len(fetched_jobs) >= min(len(JOBS), k + 2 + ahead):
                    break
                threading.Event().wait(0.002)
            assert len(fetched_jobs) <= k + 2 + ahead, (k, fetched_jobs)
            assert job == JOBS[k]
    assert fetched_jobs == JOBS


def test_the_fetching_thread_is_gone_when_the_round_ends_early():
    """A round that stops after two jobs (``stop()``): the fetching thread fetches nothing
    more once told, and is joined before the round returns."""
    stop = threading.Event()
    fetched_jobs: list[str] = []

    def fetch(job: str) -> str:
        fetched_jobs.append(job)
        return job

    before = {t.ident for t in threading.enumerate()}
    with fetched_ahead(JOBS, fetch, 1, stop) as fetched:
        for k, _ in enumerate(fetched):
            if k == 1:
                stop.set()
                break
    assert len(fetched_jobs) <= 4
    assert {t.ident for t in threading.enumerate()} <= before  # no thread left behind
    assert not any(t.name == "argus-score-fetch" for t in threading.enumerate())


def test_a_stop_before_the_next_job_ends_the_jobs_given():
    """The fetching thread stops at ``stop`` (the scorer's ``stop()`` also closes the
    connection of the fetch under way); the consumer then gets no more jobs, and waits for
    none."""
    stop = threading.Event()

    def fetch(job: str) -> str:
        if job == "job-2":
            stop.set()
        return job

    with fetched_ahead(JOBS, fetch, 1, stop) as fetched:
        got = [job for job, _, _ in fetched]
    assert got[:3] == JOBS[:3] and len(got) <= 3
