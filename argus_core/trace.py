"""Columnar, in-memory form of one job's trace records.

Records arrive one JSON object at a time; diagnosis wants whole columns. ``TraceBuilder``
collects validated records per job and ``finish()`` concatenates them into numpy arrays: steps
as a (steps x phases) matrix, kernels as parallel columns with names interned once in a
``SymbolTable``. Nothing here holds one Python object per kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus_core.schema import AXES, KernelBatch, RankRecord, Record, StackRecord, StepRecord

NO_GPU_T = -1  # StepTable.gpu_t_ns of a step recorded without device time (host clock, CPU)


class SymbolTable:
    """Interns strings (kernel or phase names) to dense integer ids, first come first numbered."""

    def __init__(self, names: list[str] | None = None):
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        for name in names or []:
            self.intern(name)

    def intern(self, name: str) -> int:
        """Return the id of ``name``, adding it if new."""
        ident = self._ids.get(name)
        if ident is None:
            ident = self._ids[name] = len(self.names)
            self.names.append(name)
        return ident

    def ids(self, names: list[str]) -> np.ndarray:
        """Ids for a list of names, as an int32 lookup array (local index -> global id)."""
        return np.fromiter((self.intern(n) for n in names), dtype=np.int32, count=len(names))

    def get(self, name: str) -> int | None:
        """Id of ``name`` or None when it was never seen."""
        return self._ids.get(name)

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class PeerTable:
    """Point-to-point phases' time per peer: one row per (step row, phase, peer).

    ``row`` indexes the StepTable's rows, ``phase`` its ``phase_names``; ``peer`` is the
    global rank the rank exchanged data with in that phase: ``seconds`` in all, in ``count``
    messages, the shortest ``shortest_s`` long."""

    row: np.ndarray  # int64
    phase: np.ndarray  # int64
    peer: np.ndarray  # int64
    seconds: np.ndarray  # float64
    count: np.ndarray  # int64
    shortest_s: np.ndarray  # float64

    @classmethod
    def empty(cls) -> PeerTable:
        """No point-to-point phase named a peer."""
        ints, floats = np.zeros(0, dtype=np.int64), np.zeros(0)
        return cls(ints, ints, ints, floats, ints, floats)

    def __len__(self) -> int:
        return len(self.row)


@dataclass
class StepTable:
    """Steps of all ranks, one row per (rank, step); ``phases`` is rows x phases, NaN = absent.

    ``t_ns`` is host time at each step's start; ``gpu_t_ns`` when its work started on the
    device, on the clock of kernels' ``start_ns`` (``NO_GPU_T`` where the step has none).
    """

    rank: np.ndarray
    step: np.ndarray
    t_ns: np.ndarray
    wall_s: np.ndarray
    gpu_s: np.ndarray
    phase_names: list[str]
    phases: np.ndarray
    gpu_t_ns: np.ndarray | None = None  # device start (kernels' clock); NO_GPU_T where absent
    peers: PeerTable | None = None  # point-to-point phases per peer (empty when none named)
    cpu_wait_s: np.ndarray | None = None  # the training thread's wait for a CPU; NaN: absent

    def __post_init__(self) -> None:
        if self.gpu_t_ns is None:
            self.gpu_t_ns = np.full(len(self.rank), NO_GPU_T, dtype=np.int64)
        if self.cpu_wait_s is None:
            self.cpu_wait_s = np.full(len(self.rank), np.nan)
        if self.peers is None:
            self.peers = PeerTable.empty()

    def __len__(self) -> int:
        return len(self.rank)


@dataclass
class KernelTable:
    """Kernel executions of all ranks as parallel columns; ``name`` indexes ``names``."""

    rank: np.ndarray
    name: np.ndarray
    stream: np.ndarray
    start_ns: np.ndarray
    dur_ns: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return len(self.rank)

    def take(self, mask: np.ndarray) -> KernelTable:
        """Rows where ``mask`` is true (a boolean array or an index array)."""
        return KernelTable(self.rank[mask], self.name[mask], self.stream[mask],
                           self.start_ns[mask], self.dur_ns[mask], self.names)


@dataclass
class Trace:
    """Everything recorded for one job."""

    job: str
    ranks: dict[int, RankRecord]
    steps: StepTable
    kernels: KernelTable
    stacks: list[StackRecord] = field(default_factory=list)
    # rank -> step numbers recorded again at another time (a restarted process counting from
    # 0 into the same spool): the latest copy is kept, so the attempts are mixed
    restarted_steps: dict[int, int] = field(default_factory=dict)

    @property
    def rank_ids(self) -> np.ndarray:
        """Sorted ids of every rank seen in any record."""
        seen = set(self.ranks) | set(np.unique(self.steps.rank).tolist())
        seen |= set(np.unique(self.kernels.rank).tolist())
        seen |= {s.rank for s in self.stacks}
        return np.array(sorted(seen), dtype=np.int64)

    def coords(self, ranks: np.ndarray) -> np.ndarray:
        """(len(ranks) x 4) coords in AXES order; ranks without a rank record sit at 0."""
        out = np.zeros((len(ranks), len(AXES)), dtype=np.int64)
        for i, r in enumerate(ranks.tolist()):
            info = self.ranks.get(r)
            if info is not None:
                out[i] = info.coords
        return out


class _JobBuilder:
    def __init__(self, job: str):
        self.job = job
        self.ranks: dict[int, RankRecord] = {}
        self.step_rows: list[StepRecord] = []
        self.kernel_parts: list[tuple[int, np.ndarray, KernelBatch]] = []
        self.kernel_columns: list[tuple[np.ndarray, ...]] = []  # bulk-parsed batches
        self.stacks: list[StackRecord] = []


class TraceBuilder:
    """Accumulates validated records, per job, and builds columnar ``Trace`` objects."""

    def __init__(self) -> None:
        self._jobs: dict[str, _JobBuilder] = {}
        self.kernel_names = SymbolTable()

    def add(self, record: Record) -> None:
        """Add one validated record."""
        job = self._jobs.get(record.job)
        if job is None:
            job = self._jobs[record.job] = _JobBuilder(record.job)
        if isinstance(record, KernelBatch):
            if len(record.name):
                job.kernel_parts.append((record.rank, self.kernel_names.ids(record.names), record))
        elif isinstance(record, StepRecord):
            job.step_rows.append(record)
        elif isinstance(record, RankRecord):
            job.ranks[record.rank] = record  # the latest identity wins
        else:
            job.stacks.append(record)

    def add_kernel_columns(self, job: str, rank: np.ndarray, name: np.ndarray,
                           stream: np.ndarray, start_ns: np.ndarray, dur_ns: np.ndarray) -> None:
        """Add many validated kernel executions of one job at once; ``name`` holds ids of
        ``self.kernel_names`` (the reader's bulk path: many small batches in one go)."""
        builder = self._jobs.get(job)
        if builder is None:
            builder = self._jobs[job] = _JobBuilder(job)
        builder.kernel_columns.append((rank, name, stream, start_ns, dur_ns))

    @property
    def jobs(self) -> list[str]:
        """Jobs seen so far, in order of first appearance."""
        return list(self._jobs)

    def finish(self) -> dict[str, Trace]:
        """Build one columnar Trace per job."""
        traces = {}
        for name, b in self._jobs.items():
            steps, restarted = _steps(b.step_rows)
            traces[name] = Trace(name, b.ranks, steps,
                                 self._kernels(b.kernel_parts, b.kernel_columns), b.stacks,
                                 restarted)
        return traces

    def _kernels(self, parts: list[tuple[int, np.ndarray, KernelBatch]],
                 columns: list[tuple[np.ndarray, ...]]) -> KernelTable:
        names = self.kernel_names.names
        if parts:
            lengths = [len(batch.name) for _, _, batch in parts]
            columns = [(
                np.repeat(np.array([r for r, _, _ in parts], dtype=np.int64), lengths),
                np.concatenate([lut[batch.name] for _, lut, batch in parts]),
                np.concatenate([batch.stream for _, _, batch in parts]),
                np.concatenate([batch.start_ns for _, _, batch in parts]),
                np.concatenate([batch.dur_ns for _, _, batch in parts])), *columns]
        if not columns:
            empty = np.zeros(0, dtype=np.int64)
            return KernelTable(empty, empty.astype(np.int32), empty, empty, empty, names)
        rank, name, stream, start, dur = (np.concatenate(c) for c in zip(*columns, strict=True))
        return KernelTable(rank=rank.astype(np.int64), name=name.astype(np.int32),
                           stream=stream.astype(np.int64), start_ns=start.astype(np.int64),
                           dur_ns=dur.astype(np.int64), names=names)


def _steps(rows: list[StepRecord]) -> tuple[StepTable, dict[int, int]]:
    """The steps as columns, one row per (rank, step), and per rank how many step numbers
    were recorded again at another time (a restarted process)."""
    phase_names = _phase_order(rows)
    phases = np.full((len(rows), len(phase_names)), np.nan)
    for i, row in enumerate(rows):
        for name, seconds in row.phases.items():
            phases[i, phase_names.get(name)] = seconds
    rank = np.array([r.rank for r in rows], dtype=np.int64)
    step = np.array([r.step for r in rows], dtype=np.int64)
    t_ns = np.array([r.t_ns for r in rows], dtype=np.int64)
    # A (rank, step) sent twice (a retried upload) counts once: the last copy wins. Sent at
    # another time (a restarted process counting from 0 again), the latest attempt's wins.
    order = np.lexsort((np.arange(len(rows)), t_ns, step, rank))
    restarted: dict[int, int] = {}
    if len(order):
        same = (rank[order][1:] == rank[order][:-1]) & (step[order][1:] == step[order][:-1])
        again = same & (t_ns[order][1:] != t_ns[order][:-1])
        for r, n in zip(*np.unique(rank[order][1:][again], return_counts=True), strict=True):
            restarted[int(r)] = int(n)
        last = np.ones(len(order), dtype=bool)
        last[:-1] = ~same
        order = order[last]
    return StepTable(
        rank=rank[order], step=step[order],
        t_ns=t_ns[order] if rows else rank,
        wall_s=np.array([r.wall_s for r in rows], dtype=np.float64)[order],
        gpu_s=np.array([r.gpu_s for r in rows], dtype=np.float64)[order],
        phase_names=phase_names.names, phases=phases[order],
        gpu_t_ns=np.array([NO_GPU_T if r.gpu_t_ns is None else r.gpu_t_ns for r in rows],
                          dtype=np.int64)[order],
        peers=_peer_table(rows, order, phase_names),
        cpu_wait_s=np.array([np.nan if r.cpu_wait_s is None else r.cpu_wait_s for r in rows],
                            dtype=np.float64)[order]), restarted


def _peer_table(rows: list[StepRecord], order: np.ndarray, phase_names: SymbolTable,
                ) -> PeerTable:
    """The rows' ``peers`` as columns, indexed by the kept rows' new positions (``order``)."""
    position = np.full(len(rows), -1, dtype=np.int64)
    position[order] = np.arange(len(order))
    row, phase, peer, times = [], [], [], []
    for i, record in enumerate(rows):
        if not record.peers or position[i] < 0:
            continue
        for name, by_peer in record.peers.items():
            for other, value in by_peer.items():
                row.append(position[i])
                phase.append(phase_names.get(name))
                peer.append(other)
                times.append(value)
    if not row:
        return PeerTable.empty()
    seconds, count, shortest = (np.array(c) for c in zip(*times, strict=True))
    return PeerTable(np.array(row, dtype=np.int64), np.array(phase, dtype=np.int64),
                     np.array(peer, dtype=np.int64), seconds.astype(np.float64),
                     count.astype(np.int64), shortest.astype(np.float64))


def _phase_order(rows: list[StepRecord]) -> SymbolTable:
    """Phase names in the order phases happen within a step.

    Each record lists its phases in the order they started; a phase missing from some steps
    (a custom phase, a warm-up step) is placed by its mean position among the others.
    """
    position: dict[str, list[float]] = {}  # name -> [sum of relative positions, count]
    for row in rows:
        last = max(len(row.phases) - 1, 1)
        for i, name in enumerate(row.phases):
            acc = position.setdefault(name, [0.0, 0])
            acc[0] += i / last
            acc[1] += 1
    return SymbolTable(sorted(position, key=lambda n: position[n][0] / position[n][1]))
