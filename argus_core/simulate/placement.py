"""Where simulated ranks run, and faults of the shared hardware (a GPU, NIC, PCIe switch, host,
leaf or spine switch) as the per-rank faults they cause.

Ranks fill hosts in order (``gpus_per_host`` each, local rank = GPU index); a host's GPUs sit in
pairs behind a PCIe switch with one NIC; hosts fill leaf switches (``hosts_per_leaf``: one
size for every leaf, or each leaf's size in turn, the last repeated) with one rack per leaf
(top-of-rack switches); leaves fill spines (``leaves_per_spine``, 0: one spine).

A hardware fault slows what the unit carries:

    unit:kind=gpu:name=node-3/gpu5:factor=2:from=10     the GPU's compute phases x2
    unit:kind=nic:name=node-3/mlx5_2:factor=4           its ranks' collective kernels on the
                                                        cross-host axis x4
    unit:kind=pcie_switch:name=node-3/0000:35:00.0      as a NIC fault, for the GPUs behind it
    unit:kind=host:name=node-3:seconds=0.02             every rank of the host stalls on the
                                                        host 20 ms a step (CPU, memory)
    unit:kind=leaf:name=leaf-1:factor=3                 cross-host collective kernels of every
                                                        rank under the leaf x3

Names are those ``rank_units`` gives (``argus_core.hardware``), so a sweep compares
the unit it degraded with the unit the diagnosis names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from argus_core.hardware import UNIT_KINDS, rank_units
from argus_core.schema import RankRecord
from argus_core.simulate.faults import Fault, spec_fields
from argus_core.topology import Topology

COMPUTE_PHASES = ("attention", "mlp", "backward")


@dataclass(frozen=True)
class Hardware:
    """How ranks map onto hosts, PCIe switches, NICs and the network."""

    gpus_per_host: int = 8
    gpus_per_switch: int = 2
    hosts_per_leaf: tuple[int, ...] = (4,)
    leaves_per_spine: int = 0

    def __post_init__(self) -> None:
        if self.gpus_per_host < 1 or self.gpus_per_switch < 1:
            raise ValueError("gpus_per_host and gpus_per_switch must be >= 1")
        if not self.hosts_per_leaf or min(self.hosts_per_leaf) < 1:
            raise ValueError(f"hosts_per_leaf must be sizes >= 1, got {self.hosts_per_leaf}")
        if self.leaves_per_spine < 0:
            raise ValueError(f"leaves_per_spine must be >= 0, got {self.leaves_per_spine}")

    def leaf_of(self, host: int) -> int:
        """The leaf switch a host sits under."""
        leaf, first = 0, 0
        while True:
            size = self.hosts_per_leaf[min(leaf, len(self.hosts_per_leaf) - 1)]
            if host < first + size:
                return leaf
            leaf, first = leaf + 1, first + size

    def rank_record(self, job: str, rank: int, world: int,
                    coords: tuple[int, int, int, int]) -> RankRecord:
        """The identity of one rank, with its placement."""
        host, gpu = divmod(rank, self.gpus_per_host)
        switch = gpu // self.gpus_per_switch
        leaf = self.leaf_of(host)
        spine = leaf // self.leaves_per_spine if self.leaves_per_spine else 0
        placement = {"gpu": f"GPU-{host:08x}-{gpu:04x}-4000-8000-000000000000",
                     "pci_bus": f"0000:{0x18 + 0x10 * gpu:02x}:00.0",
                     "numa": gpu * 2 // self.gpus_per_host, "nic": f"mlx5_{switch}",
                     "pcie_switch": f"0000:{0x15 + 0x20 * switch:02x}:00.0",
                     "rack": f"rack-{leaf}", "leaf": f"leaf-{leaf}", "spine": f"spine-{spine}"}
        return RankRecord(job, rank, world, f"node-{host}", gpu, coords, placement)

    def rank_records(self, job: str, topology: Topology) -> dict[int, RankRecord]:
        """Every rank's identity in a job of this topology."""
        coords = topology.coords()
        return {r: self.rank_record(job, r, topology.world_size, tuple(map(int, coords[r])))
                for r in range(topology.world_size)}


@dataclass(frozen=True)
class UnitFault:
    """A fault of one hardware unit, named as ``rank_units`` names it."""

    kind: str
    name: str
    factor: float = 3.0  # gpu: compute slowdown; nic, pcie_switch, leaf, spine: transfer
    seconds: float = 0.02  # host: host stall a step
    start: int = 0
    axis: str = "dp"  # the axis whose collectives cross hosts

    def __post_init__(self) -> None:
        if self.kind not in UNIT_KINDS:
            raise ValueError(f"unit fault kind {self.kind!r}: expected one of "
                             f"{', '.join(UNIT_KINDS)}")

    def faults(self, ranks: Mapping[int, RankRecord]) -> tuple[Fault, ...]:
        """The per-rank faults this unit's degradation causes; raises if no rank is under it."""
        members = tuple(sorted(r for r, info in ranks.items()
                               if rank_units(info).get(self.kind) == self.name))
        if not members:
            raise ValueError(f"no rank runs under {self.kind} {self.name!r}")
        if self.kind == "gpu":
            return (Fault("compute", members, phases=dict.fromkeys(COMPUTE_PHASES, self.factor),
                          start=self.start),)
        if self.kind == "host":
            return (Fault("stall", members, start=self.start, seconds=self.seconds),)
        return (Fault("link", members, axis=self.axis, factor=self.factor, local=True,
                      start=self.start),)

    def __str__(self) -> str:
        size = f"seconds={self.seconds:g}" if self.kind == "host" else f"factor={self.factor:g}"
        return f"unit:kind={self.kind}:name={self.name}:{size}:from={self.start}"


def parse_unit_fault(spec: str) -> UnitFault:
    """Parse ``unit:kind=K:name=N[:factor=F][:seconds=S][:from=STEP][:axis=A]`` (a name may
    hold colons, as a PCIe address does); raises ValueError naming the bad part."""
    head, *tokens = spec.split(":")
    if head != "unit":
        raise ValueError(f"fault {spec!r}: a hardware fault starts with 'unit:'")
    parts: list[str] = []
    for token in tokens:  # a token without '=' continues the previous value
        if "=" not in token and parts:
            parts[-1] += ":" + token
        else:
            parts.append(token)
    fields = spec_fields(spec, parts)
    try:
        fault = UnitFault(fields.pop("kind"), fields.pop("name"),
                          factor=float(fields.pop("factor", "3")),
                          seconds=float(fields.pop("seconds", "0.02")),
                          start=int(fields.pop("from", "0")), axis=fields.pop("axis", "dp"))
    except KeyError as exc:
        raise ValueError(f"fault {spec!r}: missing {exc.args[0]}=") from None
    if fields:
        raise ValueError(f"fault {spec!r}: unknown key {sorted(fields)[0]!r}")
    return fault
