"""What the scorer reads from Prometheus for one job, rebuilt as the core's tables.

- Kernel summaries (the processors' ``argus_kernel_executions`` and
  ``argus_kernel_duration_seconds{quantile="0.5"|"0.99"}``, one row per cluster) become a
  ``KernelSummary``: the same table ``argus diagnose`` scores.
- Each rank's coordinates come from ``argus_rank_info`` (the processors' info metric).
- Each rank's phase medians (the exporters' ``argus_phase_window_seconds{stat="median"}``),
  its median step time (``argus_step_window_seconds{stat="median"}``) and the order of the
  phases within a step (``argus_phase_order_info``) become a ``PhaseTable``: one "step" of
  medians for the core's L2 and its arrival-skew waiting (who reached a collective last
  depends on the phases before it). Coordinates and host come from the exporters' labels.
  For the collectives, also their shortest time in the window (``stat="min"``): a step
  in which the rank waited for nobody, its transfer time alone.
- Each rank's steps per second, to turn a window's kernel time into time per step.

The kernel summaries (millions of series) and the ranks' phase series (hundreds of thousands)
are decoded straight into columns (``PrometheusAPI.query_columns``) and joined with numpy;
the ranks' identities read JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter, methodcaller

import numpy as np

from argus_core.gcpause import cycle_collection_paused
from argus_core.schema import AXES, PLACEMENT_TEXT, RankRecord
from argus_core.score.prometheus import PrometheusAPI, quote_label
from argus_core.score.vector_columns import (
    DecodeError,
    Text,
    VectorColumns,
    columns_from_result,
    is_int,
)
from argus_core.stats.grouping import dense_ids
from argus_core.summaries import KernelSummary

IQR_SIGMAS = 1.349  # a normal's interquartile range in standard deviations


@dataclass
class PhaseTable:
    """Per rank (sorted), the median time of each phase over its recent steps."""

    ranks: np.ndarray
    names: list[str]  # in the order the phases happen within a step
    values: np.ndarray  # ranks x phases, NaN = not reported
    coords: np.ndarray  # ranks x 4 (AXES order)
    wall: np.ndarray | None = None  # per rank: median step wall time, NaN = not reported
    hosts: list[str] | None = None  # per rank: its host label
    minimum: np.ndarray | None = None  # ranks x phases: shortest time in the window (NaN)
    noise: np.ndarray | None = None  # ranks x phases: sigma of ln(time) in the window (NaN)


@dataclass
class JobSnapshot:
    """One job as Prometheus holds it right now."""

    job: str
    summary: KernelSummary
    coords: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> AXES coords
    phases: PhaseTable | None = None  # medians over each rank's last steps
    steps_per_s: dict[int, float] = field(default_factory=dict)
    peer_sets: list[int] | None = None  # positions whose summaries were fetched (None: all)
    stage_sample: KernelSummary | None = None  # with peer_sets: the stage sample's others
    identities: dict[int, RankRecord] = field(default_factory=dict)  # host and placement
    cpu_wait: dict[int, float] = field(default_factory=dict)  # rank -> median CPU wait a step
    host_clock: bool = False  # phases timed on the host clock (``on_host_clock``)

    @property
    def known_ranks(self) -> set[int]:
        """Ranks that announced themselves to a processor."""
        return set(self.coords)


def label_columns(result: list[dict], names: tuple[str, ...]) -> tuple[list[list[str]],
                                                                        np.ndarray]:
    """The given labels of every series (one list per label) and the float values."""
    metrics = list(map(itemgetter("metric"), result))
    columns = [list(map(methodcaller("get", name, ""), metrics)) for name in names]
    values = np.fromiter(map(float, map(itemgetter(1), map(itemgetter("value"), result))),
                         np.float64, len(result))
    return columns, values


def _ints(texts: list[str], name: str) -> np.ndarray:
    """The ``name`` label of every series as integers; DecodeError (naming the label and the
    value) if one is not: a rank or coordinate the scorer cannot place is not guessed."""
    try:
        return np.fromiter(map(int, texts), np.int64, len(texts))
    except ValueError:
        bad = next(t for t in texts if not is_int(t))
        raise DecodeError(f"label {name}={bad[:100]!r} is not an integer") from None


SUMMARY_INTS = ("rank", "stream", "cluster")  # the labels kernel_summary reads
SUMMARY_TEXTS = ("kernel", "quantile")


def kernel_summary(executions: VectorColumns, durations: VectorColumns, window_ns: int,
                   names: dict[str, int] | None = None) -> KernelSummary:
    """Join executions, p50 and p99 per (rank, kernel, stream, cluster) into a summary table.

    A cluster missing any of the three (scraped mid-update, or dropped by a relabel) is left
    out rather than guessed. ``names`` (kernel name -> id) is shared by the parts of one job.
    At 10,000 ranks x 100 kernels this is 6 M series, all in columns (``VectorColumns``, the
    ``SUMMARY_INTS`` and ``SUMMARY_TEXTS`` labels): Prometheus returns a selector's series
    sorted by their labels, which puts executions, p50s and p99s in the same cluster order;
    that is checked and the columns are then aligned by position. Any other order falls back
    to a join by key; rows come in order of first appearance either way.
    """
    names = {} if names is None else names
    e_key = _cluster_keys(executions, names)
    d_key = _cluster_keys(durations, names)
    counts, seconds = executions.values, durations.values
    quantile = durations.texts["quantile"]
    is50 = quantile.codes == _code(quantile.values, "0.5")
    is99 = quantile.codes == _code(quantile.values, "0.99")
    if _same(d_key[:, is50], e_key) and _same(d_key[:, is99], e_key):
        unique, count = e_key, counts
        p50, p99 = seconds[is50] * 1e9, seconds[is99] * 1e9
    else:
        both = np.concatenate([e_key, d_key], axis=1)
        ids, _ = dense_ids(*both)
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        order = np.argsort(first)  # keys in order of first appearance
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        row = position[inverse.reshape(-1)]
        unique = both[:, first[order]]
        count, p50, p99 = (np.full(len(order), np.nan) for _ in range(3))
        n_e = e_key.shape[1]
        count[row[:n_e]] = counts
        p50[row[n_e:][is50]] = seconds[is50] * 1e9
        p99[row[n_e:][is99]] = seconds[is99] * 1e9
    rank, kernel, stream, cluster = unique
    with np.errstate(invalid="ignore"):
        ok = (count > 0) & (p50 > 0) & (p99 >= p50)
    count = count[ok].astype(np.int64)
    table = sorted(names, key=names.get)
    return KernelSummary(rank=rank[ok], kernel=kernel[ok], stream=stream[ok],
                         window=np.zeros(int(ok.sum()), dtype=np.int64),
                         cluster=cluster[ok], count=count, sum_ns=count * p50[ok],
                         p50_ns=p50[ok], p99_ns=p99[ok], names=table, window_ns=window_ns)


def finite_units(executions: VectorColumns,
                 durations: VectorColumns) -> tuple[VectorColumns, VectorColumns, int]:
    """The summaries without every (rank, kernel, stream) that has a NaN or +-Inf sample in
    either, and how many such samples there were. Such a unit is left out whole: scored on
    the clusters that remain, it would be judged on part of its distribution (a false
    finding)."""
    bad_e, bad_d = ~np.isfinite(executions.values), ~np.isfinite(durations.values)
    count = int(bad_e.sum() + bad_d.sum())
    if not count:
        return executions, durations, 0
    names: dict[str, int] = {}  # this function's own ids: the job's table is not touched
    units = np.concatenate([_cluster_keys(executions, names)[:3],
                            _cluster_keys(durations, names)[:3]], axis=1)
    ids, _ = dense_ids(*units)
    keep = ~np.isin(ids, ids[np.concatenate([bad_e, bad_d])])
    n_e = len(executions)
    return (executions.take(np.flatnonzero(keep[:n_e])),
            durations.take(np.flatnonzero(keep[n_e:])), count)


def _cluster_keys(columns: VectorColumns, names: dict[str, int]) -> np.ndarray:
    """(rank, kernel id, stream, cluster) of every series (4 x n); new kernel names get the
    next ids in order of first appearance."""
    kernel = columns.texts["kernel"]
    ids = np.array([names.setdefault(k, len(names)) for k in kernel.values] or [0],
                   dtype=np.int64)
    return np.stack([columns.ints["rank"], ids[kernel.codes], columns.ints["stream"],
                     columns.ints["cluster"]]).reshape(4, len(columns))


def _code(values: list[str], wanted: str) -> int:
    return values.index(wanted) if wanted in values else -1


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def rank_coords(info: list[dict]) -> dict[int, tuple[int, ...]]:
    """rank -> coordinates from ``argus_rank_info`` series (a missing coordinate is 0); a
    rank or coordinate that is not a number: DecodeError."""
    (rank, *axes), _ = label_columns(info, ("rank", *AXES))
    ranks = _ints(rank, "rank").tolist()
    coords = [_ints([c or "0" for c in column], axis).tolist()
              for axis, column in zip(AXES, axes, strict=True)]
    return {r: tuple(column[i] for column in coords) for i, r in enumerate(ranks)}


def rank_identities(job: str, info: list[dict], placement: list[dict]) -> dict[int, RankRecord]:
    """rank -> identity (host, local rank, placement) from ``argus_rank_info`` and
    ``argus_rank_placement_info`` series; what attribution to hardware needs. A rank without
    a placement series is its own GPU's only rank (local rank = rank)."""
    coords = rank_coords(info)
    hosts = {int(s["metric"]["rank"]): s["metric"].get("host", "") for s in info}
    where: dict[int, tuple[int, dict]] = {}
    for series in placement:
        labels = series["metric"]
        rank = _ints([labels.get("rank", "")], "rank").tolist()[0]
        local = labels.get("local_rank", "")
        place = {k: labels[k] for k in PLACEMENT_TEXT if labels.get(k)}
        if labels.get("numa", "").isdecimal():
            place["numa"] = int(labels["numa"])
        where[rank] = (int(local) if local.isdecimal() else rank, place)
    world = max(coords, default=-1) + 1
    out = {}
    for rank, position in coords.items():
        local, place = where.get(rank, (rank, {}))
        out[rank] = RankRecord(job, rank, world, hosts.get(rank, ""), local, position, place)
    return out


# What ``phase_table`` reads of each of its series: (integer labels, text labels).
PHASE_READS = {
    "phases": (("rank",), ("phase", "host", *AXES)),  # argus_phase_window_seconds, median
    "walls": (("rank",), ()),  # argus_step_window_seconds, median
    "orders": ((), ("order",)),  # argus_phase_order_info
    "minimums": (("rank",), ("phase",)),  # argus_phase_window_seconds, min (collectives)
    "quartiles": (("rank",), ("phase", "stat")),  # argus_phase_window_seconds, p25 and p75
}


def phase_table(phases: VectorColumns | None, walls: VectorColumns | None = None,
                orders: VectorColumns | None = None, minimums: VectorColumns | None = None,
                quartiles: VectorColumns | None = None) -> PhaseTable | None:
    """The ranks x phases matrix of phase medians, each rank's coordinates (a missing one is
    0), host and median step time, with the phases in the order the ranks report
    (``step_order``), the shortest time of each phase in the window where ``minimums`` has
    it, and the noise of each phase's steps where ``quartiles`` (``stat`` p25 and p75) has
    both: the normal-consistent spread of ln(time), ln(p75 / p25) / 1.349. Each argument
    holds the labels ``PHASE_READS`` names, decoded as columns (no dict per series)."""
    if phases is None or not len(phases):
        return None
    ranks, r_idx = np.unique(phases.ints["rank"], return_inverse=True)
    phase = phases.texts["phase"]
    names = step_order(sorted({phase.values[c] for c in np.unique(phase.codes).tolist()}),
                       orders)
    column = {name: i for i, name in enumerate(names)}
    table = np.full((len(ranks), len(names)), np.nan)
    table[r_idx, _phase_columns(phase, column)] = phases.values
    coords = np.zeros((len(ranks), len(AXES)), dtype=np.int64)
    coords[r_idx] = np.column_stack([_text_ints(phases.texts[axis], axis) for axis in AXES])
    host = phases.texts["host"]
    hosts = [""] * len(ranks)
    for i, code in zip(r_idx.tolist(), host.codes.tolist(), strict=True):
        hosts[i] = host.values[code]
    wall = np.full(len(ranks), np.nan)
    if walls is not None and len(walls):
        found, ok = _rows(ranks, walls.ints["rank"])
        wall[found[ok]] = walls.values[ok]
    minimum = None
    if minimums is not None and len(minimums):
        found, ok = _rows(ranks, minimums.ints["rank"])
        col = _phase_columns(minimums.texts["phase"], column)
        ok &= col >= 0
        minimum = np.full(table.shape, np.nan)
        minimum[found[ok], col[ok]] = minimums.values[ok]
    noise = None
    if quartiles is not None and len(quartiles):
        found, ok = _rows(ranks, quartiles.ints["rank"])
        col = _phase_columns(quartiles.texts["phase"], column)
        ok &= col >= 0
        stat = quartiles.texts["stat"]
        bounds = {}
        for name in ("p25", "p75"):
            bounds[name] = np.full(table.shape, np.nan)
            mine = ok & (stat.codes == _code(stat.values, name))
            bounds[name][found[mine], col[mine]] = quartiles.values[mine]
        with np.errstate(all="ignore"):
            noise = np.log(bounds["p75"] / bounds["p25"]) / IQR_SIGMAS
        noise[~np.isfinite(noise)] = np.nan
    return PhaseTable(ranks, names, table, coords, wall, hosts, minimum, noise)


def phase_table_of_results(phases: list[dict], walls: list[dict] = (),
                           orders: list[dict] = (), minimums: list[dict] = (),
                           quartiles: list[dict] = ()) -> PhaseTable | None:
    """``phase_table`` of JSON-decoded query results (``[{"metric": ..., "value": ...}]``)."""
    parts = {"phases": phases, "walls": walls, "orders": orders, "minimums": minimums,
             "quartiles": quartiles}
    return phase_table(**{name: columns_from_result(list(result), *PHASE_READS[name])
                          for name, result in parts.items()})


def _phase_columns(phase: Text, column: dict[str, int]) -> np.ndarray:
    """Each series' column in the table (-1: a phase the table does not hold)."""
    per_value = np.array([column.get(v, -1) for v in phase.values], dtype=np.int64)
    return per_value[phase.codes] if len(per_value) else np.zeros(0, dtype=np.int64)


def _text_ints(text: Text, name: str) -> np.ndarray:
    """A text label as integers per series ("" reads 0); DecodeError if one is not."""
    per_value = _ints([v or "0" for v in text.values], name)
    return per_value[text.codes] if len(per_value) else np.zeros(0, dtype=np.int64)


def _rows(ranks: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row of each ``wanted`` rank in the sorted ``ranks``, and whether it is there."""
    found = np.searchsorted(ranks, wanted)
    ok = found < len(ranks)
    ok[ok] = ranks[found[ok]] == wanted[ok]
    return found, ok


def step_order(names: list[str], orders: VectorColumns | None) -> list[str]:
    """``names`` in the order phases happen within a step, from ``argus_phase_order_info``
    series (the order most ranks report); phases it does not list come last, by name."""
    counts: dict[str, int] = {}
    if orders is not None and len(orders):
        order = orders.texts["order"]
        tally = np.bincount(order.codes, minlength=len(order.values)).tolist()
        counts = {text: n for text, n in zip(order.values, tally, strict=True) if n}
    known = max(counts, key=lambda t: (counts[t], t)).split(",") if counts else []
    rank_of = {name: i for i, name in enumerate(known)}
    return sorted(names, key=lambda n: (rank_of.get(n, len(known)), n))


def concat(parts: list[KernelSummary], names: dict[str, int], window_ns: int) -> KernelSummary:
    """One summary of parts that share the ``names`` table."""
    fields = ("rank", "kernel", "stream", "window", "cluster", "count", "sum_ns", "p50_ns",
              "p99_ns")
    columns = {f: np.concatenate([getattr(p, f) for p in parts]) if parts else
               np.zeros(0, dtype=np.float64 if f.endswith("_ns") else np.int64) for f in fields}
    return KernelSummary(**columns, names=sorted(names, key=names.get), window_ns=window_ns)


MAX_RANKS_REGEX = 8192  # longest rank regex a query carries; longer: a join
STAGE_SAMPLE = 32  # ranks of a pipeline stage whose kernels tell what the stage runs


def stage_sample(table: PhaseTable | None) -> np.ndarray:
    """The ranks whose kernel inventory decides each pipeline stage's class
    (``core_adapter.stage_classes``): the ``STAGE_SAMPLE`` lowest-numbered ranks of each
    pp stage, so that a scorer holding only some peer sets' summaries can fetch them too."""
    if table is None or not len(table.ranks):
        return np.zeros(0, dtype=np.int64)
    pp = table.coords[:, AXES.index("pp")]
    return np.concatenate([table.ranks[pp == s][:STAGE_SAMPLE] for s in np.unique(pp)])


def fetch_summaries(api: PrometheusAPI, match: str, coords: dict[int, tuple[int, ...]],
                    peer_axis: str, window_ns: int, owns: Callable[[int], bool] | None = None,
                    also: np.ndarray | None = None, export_lookback_s: float | None = None,
                    ) -> tuple[KernelSummary, KernelSummary | None, list[int]]:
    """The job's kernel summaries, fetched one peer set at a time (the ranks at one position
    on ``peer_axis``, which the core scores together), so that only one peer set's answer is
    ever decoded in memory; ranks without an identity come last (peer set 0, as the core).

    A peer set is selected by its ranks (``rank=~"[05]|1[05]"``, from ``coords``), not by a
    join with ``argus_rank_info``: the engine then reads only that peer set's series, where a
    join evaluates every series of the job for each peer set (on victoria-metrics, 0.19x the
    join's time a peer set at 10,000 ranks x 20 kernels, 0.75x at 2,000 x 100). Ranks that
    no short regex matches (over ``MAX_RANKS_REGEX`` bytes: victoria-metrics refuses a query
    over 16 KB) are selected by the join.

    ``owns(position)``: only the peer sets it is true for (a shard's); then the ranks of
    ``also`` outside them are fetched too, apart (the stage sample). With
    ``export_lookback_s``, each peer set is read through victoria-metrics' export
    (``PrometheusAPI.export_columns``: the last sample of that many seconds; a join is still
    a query). Returns the summaries, those of the ``also`` ranks (None without ``owns``) and
    the positions fetched."""
    axis = AXES.index(peer_axis)
    members: dict[int, list[int]] = {}
    for rank, position in sorted(coords.items()):
        members.setdefault(position[axis], []).append(rank)
    positions = sorted(members)

    def peer_set(p: int) -> tuple[str, str]:
        ranks = ranks_regex(members[p])
        if len(ranks) > MAX_RANKS_REGEX:
            return match, f'\nand on (job, rank) argus_rank_info{{{match},{peer_axis}="{p}"}}'
        return f'{match},rank=~"{ranks}"', ""

    def anonymous() -> tuple[str, str]:
        ranks = ranks_regex(sorted(coords))
        if len(ranks) > MAX_RANKS_REGEX:
            return match, f"\nunless on (job, rank) argus_rank_info{{{match}}}"
        return f'{match},rank!~"{ranks}"', ""

    if owns is None:
        fetched, extra = positions, None
        selects = [(match, "")] if len(positions) <= 1 else [
            *map(peer_set, positions), anonymous()]
    else:
        fetched = [p for p in positions or [0] if owns(p)]
        if len(positions) <= 1:
            selects = [(match, "")] if fetched else []
        else:
            selects = [peer_set(p) for p in fetched]
            if owns(0):
                selects.append(anonymous())
        others = [int(r) for r in ([] if also is None else also.tolist())
                  if not owns(coords[int(r)][axis] if int(r) in coords else 0)]
        extra = (f'{match},rank=~"{ranks_regex(others)}"', "") if others else None
    names: dict[str, int] = {}
    parts = [_summary_part(api, *select, window_ns, names, export_lookback_s)
             for select in selects]
    sample = None if extra is None else [_summary_part(api, *extra, window_ns, names,
                                                       export_lookback_s)]
    return (concat(parts, names, window_ns),
            None if owns is None else concat(sample or [], names, window_ns), fetched)


def ranks_regex(ranks: list[int]) -> str:
    """A label regex (RE2, anchored as PromQL anchors it) matching exactly these ranks'
    decimal texts, short: ranks whose digits differ only in one place share a character class
    (stride 5 over 0-9999 is ``[05]|[1-9][05]|...``; 2,000 ranks in about 40 bytes, not 10 KB,
    within victoria-metrics' 16 KB bound on a query). At least one rank: no regex of these
    matches nothing."""
    if not ranks:
        raise ValueError("ranks_regex needs at least one rank")
    by_length: dict[int, set[str]] = {}
    for text in map(str, ranks):
        by_length.setdefault(len(text), set()).add(text)
    return "|".join(_digits_regex(by_length[n]) for n in sorted(by_length))


def _digits_regex(texts: set[str]) -> str:
    """The regex of same-length digit strings: first digits whose suffixes match the same
    strings share one character class."""
    if not next(iter(texts)):
        return ""
    suffixes: dict[str, set[str]] = {}
    for text in texts:
        suffixes.setdefault(text[0], set()).add(text[1:])
    firsts: dict[str, list[str]] = {}  # suffix regex -> first digits
    for first, rest in sorted(suffixes.items()):
        firsts.setdefault(_digits_regex(rest), []).append(first)
    parts = [_digit_class(digits) + _grouped(rest) for rest, digits in firsts.items()]
    return "|".join(parts)


def _grouped(regex: str) -> str:
    return f"(?:{regex})" if "|" in regex else regex


def _digit_class(digits: list[str]) -> str:
    """``[0-35]`` for 0, 1, 2, 3, 5 (sorted digits); a single digit as itself."""
    if len(digits) == 1:
        return digits[0]
    runs: list[list[int]] = []
    for d in map(int, digits):
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return "[" + "".join(f"{a}" if a == b else f"{a}{b}" if b == a + 1 else f"{a}-{b}"
                         for a, b in runs) + "]"


def _summary_part(api: PrometheusAPI, match: str, where: str, window_ns: int,
                  names: dict[str, int], export_lookback_s: float | None = None,
                  ) -> KernelSummary:
    """The summaries of the series ``match`` selects, filtered by ``where`` (a query), or
    without ``where`` and with ``export_lookback_s``, exported."""
    def read(metric: str, texts: tuple[str, ...]) -> VectorColumns:
        if export_lookback_s is not None and not where:
            return api.export_columns(f"{metric}{{{match}}}", export_lookback_s,
                                      SUMMARY_INTS, texts, finite_only=False)
        return api.query_columns(f"{metric}{{{match}}}{where}", SUMMARY_INTS, texts,
                                 finite_only=False)

    # an answer read as JSON (the fallback) is a dict per series
    with cycle_collection_paused():
        executions = read("argus_kernel_executions", ("kernel",))
        durations = read("argus_kernel_duration_seconds", SUMMARY_TEXTS)
    executions, durations, nonfinite = finite_units(executions, durations)
    api.nonfinite_samples += nonfinite
    return kernel_summary(executions, durations, window_ns, names)


def fetch_job(api: PrometheusAPI, job: str, selector: str, window_s: float,
              rate_window: str, peer_axis: str = "pp",
              owns: Callable[[int], bool] | None = None,
              export_lookback_s: float | None = None) -> JobSnapshot:
    """Query everything the scorer needs about ``job`` (of the kernel summaries, only the
    peer sets ``owns`` is true for, and the stage sample: ``fetch_summaries``). With
    ``export_lookback_s`` every plain series (the ranks' phase, step and CPU-wait windows
    and the kernel summaries) is exported rather than queried (``--read export``); the
    ranks' identities and step rates are queried either way. Raises QueryError, or
    DecodeError for a rank or coordinate label that is not a number."""
    match = f"job={quote_label(job)}" + (f",{selector}" if selector else "")
    info = api.query(f"argus_rank_info{{{match}}}")
    coords = rank_coords(info)
    identities = rank_identities(job, info, api.query(f"argus_rank_placement_info{{{match}}}"))
    exprs = {"phases": f'argus_phase_window_seconds{{{match},stat="median"}}',
             "walls": f'argus_step_window_seconds{{{match},stat="median"}}',
             "orders": f"argus_phase_order_info{{{match}}}",
             "minimums": f'argus_phase_window_seconds{{{match},stat="min",'
                         f'phase=~"({"|".join(AXES)})-.*"}}',
             "quartiles": f'argus_phase_window_seconds{{{match},stat=~"p25|p75"}}'}

    def read(selector: str, ints: tuple[str, ...], texts: tuple[str, ...] = ()) -> VectorColumns:
        if export_lookback_s is not None:
            return api.export_columns(selector, export_lookback_s, ints, texts)
        return api.query_columns(selector, ints, texts)

    table = phase_table(**{name: read(expr, *PHASE_READS[name]) for name, expr in exprs.items()})
    steps = api.query_columns(
        f"sum by (rank) (rate(argus_steps_total{{{match}}}[{rate_window}]))", ("rank",))
    waits = read(f'argus_step_cpu_wait_window_seconds{{{match},stat="median"}}', ("rank",))
    clocks = read(f"argus_phase_clock_info{{{match}}}", (), ("clock",))
    summary, sample, peer_sets = fetch_summaries(api, match, coords, peer_axis,
                                                 int(window_s * 1e9), owns, stage_sample(table),
                                                 export_lookback_s)
    return JobSnapshot(
        job=job, summary=summary, coords=coords, phases=table,
        peer_sets=None if owns is None else peer_sets, stage_sample=sample,
        identities=identities,
        steps_per_s=dict(zip(steps.ints["rank"].tolist(), steps.values.tolist(), strict=True)),
        cpu_wait=dict(zip(waits.ints["rank"].tolist(), waits.values.tolist(), strict=True)),
        host_clock=on_host_clock(clocks))


def on_host_clock(clocks: VectorColumns) -> bool:
    """Whether a job's phases are timed on the host clock: most of its ranks' exporters say
    so (``argus_phase_clock_info{clock="host"}``, its ``clock`` label read as text). None
    saying (exporters before the metric, other producers): timed on a device, the tighter
    comparison."""
    clock = clocks.texts["clock"]
    return 2 * int((clock.codes == _code(clock.values, "host")).sum()) > len(clocks)


def list_jobs(api: PrometheusAPI, selector: str) -> list[str]:
    """Jobs that have processors' ranks or exporter step counters in Prometheus: each
    found by one series per rank (``argus_rank_info``, which a processor serves for every
    rank it summarises; ``argus_steps_total``), never by the kernel summaries themselves
    (at 10,000 ranks x 100 kernels, reading their 2 M executions series to list one job took
    13-27 s of a round)."""
    inner = f"{{{selector}}}" if selector else ""
    result = api.query(f"group by (job) (argus_rank_info{inner})\n"
                       f"or group by (job) (argus_steps_total{inner})")
    return sorted({r["metric"].get("job", "") for r in result} - {""})
