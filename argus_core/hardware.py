"""Hardware units: the GPU, NIC, PCIe switch, host, rack, leaf and spine switch a rank runs
under, named from its ``rank`` record (``host``, ``local_rank`` and the optional ``placement``).

The parallel topology (``argus_core.topology``) says which ranks do the same work; this says
which ranks share hardware, so a fault of one unit can be told from independent faults.
"""

from __future__ import annotations

from argus_core.schema import RankRecord

UNIT_KINDS = ("gpu", "nic", "pcie_switch", "host", "rack", "leaf", "spine")
"""Every kind of unit, smallest first."""
UNIT_WORDS = {"gpu": "GPU", "nic": "NIC", "pcie_switch": "PCIe switch", "host": "host",
              "rack": "rack", "leaf": "leaf switch", "spine": "spine switch",
              "link": "the link"}


def rank_units(info: RankRecord) -> dict[str, str]:
    """The units one rank runs under, kind -> a name unique in the job.

    A GPU, NIC or PCIe switch is named within its host (the same ``mlx5_0`` sits in every
    host); without a discovered GPU the rank's GPU is its local rank's on its host.
    """
    host = info.host or f"rank-{info.rank}"
    place = info.placement
    units = {"gpu": str(place.get("gpu") or f"{host}/gpu{info.local_rank}"), "host": host}
    if "nic" in place:
        units["nic"] = f"{host}/{place['nic']}"
    if "pcie_switch" in place:
        units["pcie_switch"] = f"{host}/{place['pcie_switch']}"
    for kind in ("rack", "leaf", "spine"):
        if kind in place:
            units[kind] = str(place[kind])
    return units
