"""Attribution to hardware: the smallest shared unit (GPU, PCIe switch, NIC, host, rack, leaf or
spine switch) that explains a set of flagged ranks and none of the healthy ones.

Per cause, the flagged ranks are those with a verdict of that cause and the healthy ranks those
with no verdict at all (a rank flagged for another cause is evidence neither way). A unit
explains its flagged members when

- at least ``min_share`` of its judged members are flagged (a plausibility floor: the healthy
  ones under it are counter-evidence, and are reported), and
- that many flagged members under one unit is beyond chance: the hypergeometric tail of drawing
  at least as many of the flagged ranks into a unit of its size from the judged ranks, below
  ``alpha`` divided by the number of units holding ``min_ranks`` flagged ranks (the units that
  could be named: Bonferroni), so a job's size does not manufacture shared units out of
  independent faults.

Units are taken greedily, the least likely by chance first (a leaf holding every flagged rank
of the job beats each of its hosts, however few of the leaf's ranks the detection caught; ties:
the one explaining more still-unexplained ranks, the smaller unit, then the kind the cause
points at first: a NIC before the PCIe switch it sits behind for communication). Flagged
ranks no shared unit explains are independent faults: each is attributed to its own GPU
(compute) or NIC (communication) when the cause is hardware, and
left unattributed when it is the host process (a data loader, a collector pause); flagged
ranks under the same own unit that chance could also explain are named together. Two ranks
flagged as the ends of one slow point-to-point link (``links``) and left unexplained are one
suspect: the link between them (unit ``A <-> B``, from each end's NIC, else its GPU). A unit whose
members are exactly another's (a NIC and its PCIe switch) is named with the other as an
alternative, not hidden.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scipy.stats import hypergeom

from argus_core.detect.verdict import ranks_text
from argus_core.hardware import UNIT_WORDS, rank_units
from argus_core.schema import RankRecord

CAUSE_UNITS = {
    "compute": ("gpu", "pcie_switch", "host", "rack"),
    "communication": ("nic", "gpu", "pcie_switch", "host", "leaf", "spine", "rack"),
    "host": ("host",),
}
"""Units a cause can sit in, in the order a tie between identical units is broken."""
OWN_UNIT = {"compute": "gpu", "communication": "nic"}
"""The unit a single flagged rank is attributed to, per cause (none: the host process)."""


@dataclass(frozen=True)
class AttributionConfig:
    """When a shared unit explains flagged ranks (defaults are the documented ones)."""

    min_share: float = 0.1  # flagged share of the unit's judged ranks
    alpha: float = 0.01  # family-wise chance of naming a unit for independent faults
    min_ranks: int = 2  # flagged ranks a shared unit needs


@dataclass(frozen=True)
class Suspect:
    """A unit named as the likely seat of a cause, with the evidence for and against."""

    unit_kind: str
    unit: str
    cause: str
    ranks: tuple[int, ...]  # flagged ranks it explains
    healthy: int  # judged ranks under it with no verdict (counter-evidence)
    outside_healthy: int  # healthy ranks under the other units of its kind (shared units)
    hosts: tuple[str, ...]
    shared: bool  # a unit several flagged ranks share (False: one rank's own hardware)
    p_value: float | None  # hypergeometric tail (None: a single rank's own unit)
    alternatives: tuple[str, ...] = ()  # "kind unit" of units with exactly these members
    cost_s: float | None = None  # the largest per-step cost of its ranks' verdicts

    @property
    def evidence(self) -> str:
        """One sentence an operator acts on."""
        word = UNIT_WORDS[self.unit_kind]
        hosts = _join(self.hosts, "host", "hosts")
        ranks = ranks_text(self.ranks)
        text = (f"suspect {word} {self.unit}: rank{'s' if len(self.ranks) > 1 else ''} {ranks} "
                f"on {hosts} {'are' if len(self.ranks) > 1 else 'is'} slow ({self.cause})")
        if self.healthy:
            text += f"; {self.healthy} healthy rank{'s' if self.healthy > 1 else ''} under it"
        if self.outside_healthy:
            text += (f"; the {self.outside_healthy} rank{'s' if self.outside_healthy > 1 else ''}"
                     f" under other {_plural(word)} {'are' if self.outside_healthy > 1 else 'is'} "
                     "healthy")
        if self.unit_kind == "link":
            text += ("; only the data between them is slow, at both ends: check the path (NICs, "
                     "cables and the switches it crosses; NVLink or PCIe within a host)")
        elif not self.shared and len(self.ranks) == 1:
            text += "; no unit it shares with other ranks explains it (an independent fault)"
        elif not self.shared:
            text += "; too few ranks in the job to tell a shared fault from chance"
        if self.alternatives:
            text += f" (or {', '.join(self.alternatives)}: the same ranks)"
        return text

    def to_json(self) -> dict:
        """The ``suspects`` entry of ``argus diagnose --json``."""
        out = {"unit_kind": self.unit_kind, "unit": self.unit, "cause": self.cause,
               "ranks": list(self.ranks), "hosts": list(self.hosts), "shared": self.shared,
               "healthy_ranks_under": self.healthy, "evidence": self.evidence}
        if self.p_value is not None:
            out["p_value"] = float(f"{self.p_value:.3g}")
        if self.alternatives:
            out["alternatives"] = list(self.alternatives)
        if self.cost_s is not None:
            out["cost_s"] = round(self.cost_s, 6)
        return out


def attribute(ranks: Mapping[int, RankRecord], flagged: Iterable[tuple[int, str]],
              judged: Iterable[int], costs: Mapping[int, float] | None = None,
              config: AttributionConfig | None = None,
              links: Iterable[tuple[int, int]] = ()) -> list[Suspect]:
    """Suspects for the ``(rank, cause)`` verdicts among the ``judged`` ranks; ``links`` are
    the pairs of ranks flagged as the two ends of a slow link (communication)."""
    config = config or AttributionConfig()
    costs = costs or {}
    judged = sorted(set(judged))
    by_cause: dict[str, set[int]] = {}
    for rank, cause in flagged:
        by_cause.setdefault(cause, set()).add(rank)
    any_flag = set().union(*by_cause.values()) if by_cause else set()
    healthy = set(judged) - any_flag
    units = {r: rank_units(ranks.get(r) or RankRecord("", r, r + 1, "", r, (0, 0, 0, 0)))
             for r in set(judged) | any_flag}  # no identity: the rank is its own host
    hosts = {r: u["host"] for r, u in units.items()}
    suspects: list[Suspect] = []
    for cause in sorted(by_cause):
        suspects += _attribute_cause(cause, by_cause[cause], healthy, units, hosts, costs,
                                     config, links if cause == "communication" else ())
    return suspects


def _attribute_cause(cause: str, flagged: set[int], healthy: set[int],
                     units: dict[int, dict[str, str]], hosts: dict[int, str],
                     costs: Mapping[int, float], config: AttributionConfig,
                     links: Iterable[tuple[int, int]] = ()) -> list[Suspect]:
    kinds = CAUSE_UNITS.get(cause, ())
    members: dict[tuple[str, str], set[int]] = {}
    for rank in flagged | healthy:
        for kind in kinds:
            if kind in units[rank]:
                members.setdefault((kind, units[rank][kind]), set()).add(rank)
    population = len(flagged) + len(healthy)
    candidates = {key: ranks for key, ranks in members.items() if ranks & flagged}
    tests = max(sum(len(r & flagged) >= config.min_ranks for r in candidates.values()), 1)
    explains: dict[tuple[str, str], float] = {}  # unit -> ln p
    for key, ranks in candidates.items():
        hit = len(ranks & flagged)
        if hit < config.min_ranks or hit < config.min_share * len(ranks):
            continue
        log_p = float(hypergeom.logsf(hit - 1, population, len(flagged), len(ranks)))
        if log_p + math.log(tests) <= math.log(config.alpha):
            explains[key] = log_p
    order = {kind: i for i, kind in enumerate(kinds)}
    left = set(flagged)
    out = []
    while left:
        scored = [(-explains[key], len(candidates[key] & left), -len(candidates[key]),
                   -order[key[0]], key)
                  for key in explains if len(candidates[key] & left) >= config.min_ranks]
        if not scored:
            break
        *_, key = max(scored)
        ranks = candidates[key]
        left -= ranks
        twins = tuple(f"{UNIT_WORDS[k]} {u}" for (k, u), other in candidates.items()
                      if (k, u) != key and other == ranks)
        out.append(_suspect(key, cause, ranks & flagged, healthy, members, hosts, costs,
                            math.exp(explains[key]), twins))
        explains.pop(key)
    for a, b in sorted({tuple(sorted(pair)) for pair in links}):
        if a in left and b in left:  # the two ends of one slow link, nothing shared explains
            left -= {a, b}
            unit = f"{_end(units[a])} <-> {_end(units[b])}"
            cost = [costs[r] for r in (a, b) if r in costs]
            out.append(Suspect("link", unit, cause, (a, b), 0, 0,
                               tuple(sorted({hosts[a], hosts[b]})), False, None, (),
                               max(cost) if cost else None))
    own = OWN_UNIT.get(cause)
    singles: dict[tuple[str, str], set[int]] = {}
    for rank in sorted(left):
        kind = own if own in units[rank] else ("gpu" if own else None)
        if kind is not None:
            singles.setdefault((kind, units[rank][kind]), set()).add(rank)
    for key, ranks in singles.items():  # several only when too few ranks to tell from chance
        out.append(_suspect(key, cause, ranks, healthy, members, hosts, costs, None, ()))
    return out


def _suspect(key: tuple[str, str], cause: str, ranks: set[int], healthy: set[int],
             members: dict[tuple[str, str], set[int]], hosts: dict[int, str],
             costs: Mapping[int, float], p_value: float | None,
             twins: tuple[str, ...]) -> Suspect:
    """A suspect ``key`` for the flagged ``ranks`` (a shared unit when ``p_value`` is set)."""
    kind, unit = key
    under = members.get(key, set(ranks))
    elsewhere = set().union(*(r for (k, u), r in members.items() if k == kind and u != unit))
    cost = [costs[r] for r in ranks if r in costs]
    return Suspect(kind, unit, cause, tuple(sorted(ranks)), len(under & healthy),
                   len(elsewhere & healthy) if p_value is not None else 0,
                   tuple(sorted({hosts[r] for r in ranks})), p_value is not None, p_value,
                   twins, max(cost) if cost else None)


def _end(units: dict[str, str]) -> str:
    """One end of a link: the rank's NIC where known, else its GPU."""
    return units.get("nic") or units["gpu"]


def _join(names: tuple[str, ...], one: str, many: str) -> str:
    if len(names) == 1:
        return f"{one} {names[0]}"
    if len(names) > 4:
        return f"{many} {', '.join(names[:4])} and {len(names) - 4} more"
    return f"{many} {', '.join(names[:-1])} and {names[-1]}"


def _plural(word: str) -> str:
    return word + ("es" if word.endswith("switch") else "s")
