"""The paper's five case studies and a healthy run, as simulator presets with expected findings.

Each ``Case`` says what to simulate and what a correct diagnosis finds, so ``argus demo`` and
the tests compare the same expectations against ``argus diagnose``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from argus_core.simulate.faults import Fault
from argus_core.simulate.model import SimConfig
from argus_core.simulate.placement import Hardware, UnitFault
from argus_core.topology import Topology


@dataclass(frozen=True)
class Expectation:
    """What a correct diagnosis of a case reports (empty = must report nothing at that level)."""

    spikes: tuple[int, ...] = ()
    regression: int | None = None  # onset step, +-1 step
    l2: frozenset[tuple[int, str]] = frozenset()  # (rank, phase)
    l3_ranks: frozenset[int] = frozenset()
    l3_kernel: str = ""  # regex every flagged kernel must match
    verdicts: dict[int, str] = field(default_factory=dict)  # rank -> cause
    evidence: str = ""  # regex the first verdict's evidence must match
    suspects: tuple[tuple[str, str], ...] | None = None  # (unit_kind, unit); None: not checked

    def mismatches(self, diagnosis: dict) -> list[str]:
        """Differences between a ``diagnose --json`` document and this expectation."""
        problems = []
        spikes = tuple(s["step"] for s in diagnosis["l1"]["spikes"])
        if spikes != self.spikes:
            problems.append(f"L1 spikes {list(spikes)}, expected {list(self.spikes)}")
        onsets = [r["step"] for r in diagnosis["l1"]["regressions"]]
        if self.regression is None and onsets:
            problems.append(f"L1 regressions at {onsets}, expected none")
        if self.regression is not None and (
                len(onsets) != 1 or abs(onsets[0] - self.regression) > 1):
            problems.append(f"L1 regressions at {onsets}, expected one at {self.regression}")
        l2 = {(s["rank"], s["phase"]) for s in diagnosis["l2"]["stragglers"]}
        if l2 != set(self.l2):
            problems.append(f"L2 {sorted(l2)}, expected {sorted(self.l2)}")
        l3 = diagnosis["l3"]["stragglers"]
        if {s["rank"] for s in l3} != set(self.l3_ranks):
            problems.append(f"L3 ranks {sorted({s['rank'] for s in l3})}, "
                            f"expected {sorted(self.l3_ranks)}")
        wrong = [s["kernel"] for s in l3 if not re.search(self.l3_kernel, s["kernel"])]
        if wrong:
            problems.append(f"L3 kernels {sorted(set(wrong))} do not match {self.l3_kernel!r}")
        verdicts = {v["rank"]: v["cause"] for v in diagnosis["verdict"]}
        if verdicts != self.verdicts:
            problems.append(f"verdicts {verdicts}, expected {self.verdicts}")
        elif self.evidence and not re.search(self.evidence, diagnosis["verdict"][0]["evidence"]):
            problems.append(f"evidence does not mention {self.evidence!r}")
        if self.suspects is not None:
            named = tuple((s["unit_kind"], s["unit"]) for s in diagnosis.get("suspects", ()))
            if sorted(named) != sorted(self.suspects):
                problems.append(f"suspects {list(named)}, expected {list(self.suspects)}")
        return problems


@dataclass(frozen=True)
class Case:
    """A named scenario: the simulation and its expected diagnosis."""

    name: str
    title: str
    topology: Topology
    faults: tuple[Fault, ...]
    expect: Expectation
    steps: int = 40
    hardware: Hardware | None = None  # where ranks run (None: 8 ranks a host, no placement)
    unit_faults: tuple[UnitFault, ...] = ()  # faults of shared hardware, on top of ``faults``

    def all_faults(self, topology: Topology | None = None) -> tuple[Fault, ...]:
        """The per-rank faults, hardware faults expanded onto the ranks under each unit."""
        if not self.unit_faults:
            return self.faults
        hardware = self.hardware or Hardware()
        ranks = hardware.rank_records(self.name, topology or self.topology)
        return self.faults + tuple(f for unit in self.unit_faults for f in unit.faults(ranks))

    def config(self, seed: int = 0, **overrides) -> SimConfig:
        """The simulator configuration of this case (job named after the case)."""
        values = {"job": self.name, "topology": self.topology, "steps": self.steps,
                  "faults": self.all_faults(overrides.get("topology")), "seed": seed,
                  "hardware": self.hardware, **overrides}
        return SimConfig(**values)


_GEMM_OR_ATTN = r"gemm|flash|gelu|layer_norm"
_TP_COLLECTIVES = r"AllGather|ReduceScatter"

CASES: dict[str, Case] = {case.name: case for case in (
    Case("compute-straggler", "1 compute straggler (DP rank 5, attention x25, mlp x20)",
         Topology(dp=8),
         (Fault("compute", (5,), phases={"attention": 25, "mlp": 20}, start=15),),
         Expectation(regression=15, l2=frozenset({(5, "attention"), (5, "mlp")}),
                     l3_ranks=frozenset({5}), l3_kernel=_GEMM_OR_ATTN,
                     verdicts={5: "compute"})),
    Case("link-degradation", "2 link degradation (TP group 4-7, collectives x8-x20)",
         Topology(tp=4, dp=2),
         (Fault("link", (4, 5, 6, 7), axis="tp", factor=8,
                ops={"AllGather": 12, "ReduceScatter": 20}),),
         Expectation(l3_ranks=frozenset({4, 5, 6, 7}), l3_kernel=_TP_COLLECTIVES,
                     verdicts={4: "communication", 5: "communication", 6: "communication",
                               7: "communication"})),
    Case("pp-bubble", "3 pipeline stage 3 backward x1.9, hidden by aligned totals",
         Topology(pp=4, dp=2),
         (Fault("compute", (6, 7), phases={"backward": 1.9}),),
         Expectation(l2=frozenset({(6, "backward"), (7, "backward")}),
                     verdicts={6: "compute", 7: "compute"})),
    Case("jit-stall", "4 host-side JIT stalls (rank 3, steps 12 and 27)",
         Topology(dp=8),
         (Fault("stall", (3,), steps=(12, 27), seconds=2.5),),
         Expectation(spikes=(12, 27), verdicts={3: "host"}, evidence="GPU time")),
    Case("misleading-network", "5 compute straggler that looks like the network (rank 6 mlp x3)",
         Topology(tp=2, ep=4, dp=2),
         (Fault("compute", (6,), phases={"mlp": 3}, start=10),),
         Expectation(regression=10, l2=frozenset({(6, "mlp")}), l3_ranks=frozenset({6}),
                     l3_kernel=r"mlp|gelu", verdicts={6: "compute"},
                     evidence="network is not the cause")),
    Case("healthy", "healthy run (no fault)", Topology(dp=4, tp=2), (), Expectation()),
    Case("leaf-switch", "leaf switch leaf-1 degraded (64 ranks on 8 hosts under 2 leaves; "
         "ranks 48-63 under it, cross-host all-reduce x3 from step 10)",
         Topology(dp=8, tp=8), (),
         Expectation(regression=10, l2=frozenset((r, "dp-allreduce") for r in range(48, 64)),
                     l3_ranks=frozenset(range(48, 64)), l3_kernel=r"AllReduce",
                     verdicts=dict.fromkeys(range(48, 64), "communication"),
                     suspects=(("leaf", "leaf-1"),)),
         hardware=Hardware(hosts_per_leaf=(6, 2)),
         unit_faults=(UnitFault("leaf", "leaf-1", factor=3, start=10),)),
)}
