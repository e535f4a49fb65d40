"""Point-to-point links judged pair by pair: a slow link between two pipeline stages, named.

A send or recv phase that names its peer (the step record's ``peers``) says how long the rank
spent exchanging data with that one rank, in how many messages, and how long the shortest
message took. For a directed link a -> b, each message has two ends: a's send and b's recv.
Whichever end got there first waited for the other inside its call; the end that came last
waited only for the data to cross. A late stage (slow compute, a host stall) makes its
neighbours' sends and recvs long, but only the messages it is late for, and never both ends
of one message; a degraded link (a bad cable, a congested port, a GPU sleep queued before
the send) makes every message long at both ends. Step records keep sums, not messages, and a
sum mixes messages where one end waited with messages where the other did; the shortest
message of a step on either end waited least. So the link's own time in a step is taken as

    link(a -> b, t) = messages x min(a's shortest send to b, b's shortest recv from a)

Pipelines' links need not carry alike messages (Argus does not know their sizes), so each
link is judged against its own history: an upward shift of its log time (a CUSUM split, in
units of the link's step-to-step noise widened by its drift: links on a busy host change pace
for several steps at a time, beyond the family-wise z for every link and split point), by at
least ``min_ratio`` in the medians. What it costs the job is what the job lost: the link's
rise a step, at most the rise of the job's own step (its slowest rank's) across the same
onset; a link that slowed while the job did not costs nothing, and the verdict needs its cost
above the floor. A link slow from its first judged step has no history to stand out from, and a link
of which only some messages slow down (the shortest stays fast) is not found here.

A message also waits for its receiver to be scheduled: on a host short of CPU (more busy
threads than cores) every message of a link can be late at both ends for tens of steps. A
link whose ends' training threads waited for a CPU (``cpu_wait_s``, the run delay) longer
across the same onset, by at least ``cpu_wait_share`` of the link's rise a step, is marked
``short_of_cpu``: the host's load, not the link. (A slow link, a congested port or a sleep
queued before the send waits off the CPU and leaves the run delay flat.)

Links need both ends recorded with their peers (``argus_exporters`` names the peer of every
``send``/``recv`` it times); phases whose operation is neither are not links.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.steps import StepMatrix
from argus_core.stats.changepoint import drift_noise_scale, row_noise, upward_shifts
from argus_core.stats.robust import family_z, nanmedian
from argus_core.taxonomy import phase_axis, phase_op
from argus_core.trace import StepTable

MIN_SECONDS = 1e-6  # link times below 1 us are measurement noise


@dataclass(frozen=True)
class LinkConfig:
    """When a link's time has risen enough to be a finding (defaults are the documented
    ones)."""

    min_ratio: float = 1.2  # its median time a step rose at least 20%
    alpha: float = 0.002  # expected falsely flagged links per job (family-wise)
    z_threshold: float = 4.0  # never flag below this z
    noise_floor: float = 0.05  # step-to-step noise of ln(time) assumed at least 5%
    min_segment: int = 5  # steps on each side of the onset
    min_coverage: float = 0.8  # share of the judged steps a link must be recorded in
    cpu_wait_share: float = 0.5  # an end's extra wait for a CPU this share of the rise: load


@dataclass(frozen=True)
class LinkFinding:
    """A directed point-to-point link that slowed down from ``onset`` on."""

    sender: int
    receiver: int
    axis: str  # the parallel axis of its phases ("pp"), or "" when they name none
    onset: int  # first slow step
    before_s: float  # the link's median time a step before the onset
    after_s: float  # ... and from it on
    z: float
    job_rise_s: float = float("inf")  # how much the job's step rose across the onset
    cpu_wait_rise_s: float = float("nan")  # the larger rise of its ends' wait for a CPU
    short_of_cpu: bool = False  # that rise explains the link's: the host's load, not the link

    @property
    def ratio(self) -> float:
        """How many times longer the link takes a step than before."""
        return self.after_s / max(self.before_s, MIN_SECONDS)

    @property
    def excess_s(self) -> float:
        """Seconds a step the link takes more than before."""
        return max(self.after_s - self.before_s, 0.0)

    @property
    def cost_s(self) -> float:
        """Seconds a step the job lost to it: its excess, at most the job's own rise."""
        return min(self.excess_s, max(self.job_rise_s, 0.0))


@dataclass(frozen=True)
class LinkTimes:
    """Each directed link's own time per step (links x steps, NaN where an end is missing):
    its messages times the shortest message on either end."""

    sender: np.ndarray  # int64, per link
    receiver: np.ndarray  # int64, per link
    axis: list[str]  # per link
    seconds: np.ndarray  # links x steps of the StepMatrix


def link_times(table: StepTable, matrix: StepMatrix) -> LinkTimes:
    """Every directed link's own time per step: its messages times the shortest message on
    either end (sends on the sender, recvs on the receiver)."""
    peers = table.peers
    empty = LinkTimes(np.zeros(0, np.int64), np.zeros(0, np.int64), [],
                      np.zeros((0, len(matrix.steps))))
    if peers is None or not len(peers):
        return empty
    ops = np.array([phase_op(n) for n in table.phase_names], dtype=object)[peers.phase]
    axes = np.array([phase_axis(n) or "" for n in table.phase_names], dtype=object)[peers.phase]
    is_send, is_recv = ops == "send", ops == "recv"
    keep = is_send | is_recv
    if not keep.any():
        return empty
    rank = table.rank[peers.row]
    # the link's ends: a send goes from the rank to its peer, a recv from the peer to it
    sender = np.where(is_send, rank, peers.peer)[keep]
    receiver = np.where(is_send, peers.peer, rank)[keep]
    side = is_recv[keep].astype(np.int64)  # 0: the sender's record, 1: the receiver's
    axis = axes[keep]
    step_idx = np.searchsorted(matrix.steps, table.step[peers.row][keep])
    unique, link = np.unique(np.stack([sender, receiver], axis=1), axis=0, return_inverse=True)
    link = link.reshape(-1)
    n_links, n_steps = len(unique), len(matrix.steps)
    messages = np.zeros((2, n_links, n_steps))
    shortest = np.full((2, n_links, n_steps), np.inf)
    np.add.at(messages, (side, link, step_idx), peers.count[keep])
    np.minimum.at(shortest, (side, link, step_idx), peers.shortest_s[keep])
    both = (messages[0] > 0) & (messages[1] > 0)
    fastest = np.where(both, np.minimum(shortest[0], shortest[1]), np.nan)
    seconds = np.maximum(messages[0], messages[1]) * fastest
    first_axis = np.full(n_links, "", dtype=object)
    first_axis[link[::-1]] = axis[::-1]  # any of its phases' axes (they agree)
    return LinkTimes(unique[:, 0].astype(np.int64), unique[:, 1].astype(np.int64),
                     [str(a) for a in first_axis], seconds)


def detect_links(table: StepTable, matrix: StepMatrix, calm: np.ndarray,
                 config: LinkConfig | None = None,
                 iteration_s: np.ndarray | None = None) -> list[LinkFinding]:
    """Links whose own time rose significantly during the judged (``calm``) steps;
    ``iteration_s`` (the job's step time, per step of the matrix) bounds what each costs."""
    config = config or LinkConfig()
    times = link_times(table, matrix)
    if not len(times.sender) or calm.sum() < 2 * config.min_segment:
        return []
    steps = matrix.steps[calm]
    seconds = times.seconds[:, calm]
    covered = np.isfinite(seconds).mean(axis=1) >= config.min_coverage
    if not covered.any():
        return []
    rows = np.flatnonzero(covered)
    y = np.log(np.maximum(seconds[rows], MIN_SECONDS))
    fill = np.nanmedian(y, axis=1)  # a step missing an end counts as the link's usual time
    y = np.where(np.isfinite(y), y, fill[:, None])
    sigma = row_noise(y, config.noise_floor)
    sigma = np.array([drift_noise_scale(row, s) for row, s in zip(y, sigma, strict=True)])
    onset, stat = upward_shifts(y, config.min_segment, sigma)
    n_splits = max(y.shape[1] - 2 * config.min_segment + 1, 1)
    z_family = max(config.z_threshold, family_z(len(rows) * n_splits, config.alpha))
    found = []
    for i in np.flatnonzero(stat >= z_family):
        row, split = rows[i], int(onset[i])
        raw = np.where(np.isfinite(seconds[row]), seconds[row], np.exp(fill[i]))
        before, after = float(np.median(raw[:split])), float(np.median(raw[split:]))
        rise = float("inf")
        if iteration_s is not None:
            job = iteration_s[calm]
            rise = float(np.nanmedian(job[split:]) - np.nanmedian(job[:split]))
        ends = [int(times.sender[row]), int(times.receiver[row])]
        waited = _wait_rise(matrix, calm, ends, split)
        finding = LinkFinding(*ends, times.axis[row], int(steps[split]), before, after,
                              float(stat[i]), rise, waited,
                              bool(waited >= config.cpu_wait_share * (after - before)))
        if finding.ratio >= config.min_ratio:
            found.append(finding)
    return sorted(found, key=lambda f: (f.sender, f.receiver))


def _wait_rise(matrix: StepMatrix, calm: np.ndarray, ends: list[int], split: int) -> float:
    """The larger rise, across the judged step ``split``, of the ends' median wait for a CPU
    a step (NaN where the records carry no wait)."""
    if matrix.cpu_wait is None:
        return float("nan")
    rows = np.flatnonzero(np.isin(matrix.ranks, ends))
    waits = matrix.cpu_wait[rows][:, calm]
    if not np.isfinite(waits).any():
        return float("nan")
    rise = nanmedian(waits[:, split:], axis=1) - nanmedian(waits[:, :split], axis=1)
    return float(np.nanmax(rise)) if np.isfinite(rise).any() else float("nan")
