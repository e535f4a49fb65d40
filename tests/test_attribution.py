"""Attribution to hardware (``argus_core.detect.attribution``): the unit the flagged ranks
share is named, with its counter-evidence; independent faults stay apart; healthy jobs get no
suspect. Simulated topology faults over several seeds, the ``leaf-switch`` preset through the
CLI, and the statistics on hand-made placements."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from argus_core.detect.attribution import attribute
from argus_core.detect.diagnose import diagnose
from argus_core.schema import RankRecord, SchemaError, parse_record
from argus_core.simulate.model import SimConfig, simulate_trace
from argus_core.simulate.placement import Hardware, UnitFault, parse_unit_fault
from argus_core.topology import Topology

HARDWARE = Hardware(hosts_per_leaf=(6, 2))  # 64 ranks: leaf-0 holds 48, leaf-1 holds 16
TOPOLOGY = Topology(dp=8, tp=8)
RANKS = HARDWARE.rank_records("j", TOPOLOGY)
SEEDS = range(5)
FAULTS = {  # one unit of each kind, and the size of its fault
    "gpu": UnitFault("gpu", RANKS[29].placement["gpu"], factor=1.5, start=10),
    "nic": UnitFault("nic", "node-3/mlx5_1", factor=3, start=10),
    "host": UnitFault("host", "node-3", seconds=0.02, start=10),
    "leaf": UnitFault("leaf", "leaf-1", factor=3, start=10),
}


def _suspects(unit_faults, seed: int) -> list[dict]:
    faults = tuple(f for u in unit_faults for f in u.faults(RANKS))
    config = SimConfig(job="j", topology=TOPOLOGY, seed=seed, hardware=HARDWARE, faults=faults)
    return diagnose(simulate_trace(config)).to_json()["suspects"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_degraded_unit_is_named_and_nothing_else(kind, seed):
    """A slow GPU, NIC, host or leaf switch: exactly that unit, with every rank under it."""
    fault = FAULTS[kind]
    (suspect,) = _suspects([fault], seed)
    assert (suspect["unit_kind"], suspect["unit"]) == (fault.kind, fault.name)
    under = [r for r, info in RANKS.items()
             if {"gpu": info.placement["gpu"], "nic": f"{info.host}/{info.placement['nic']}",
                 "host": info.host, "leaf": info.placement["leaf"]}[kind] == fault.name]
    assert suspect["ranks"] == under
    assert suspect["healthy_ranks_under"] == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_a_healthy_job_has_no_suspect(seed):
    assert _suspects([], seed) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_two_independent_faults_are_not_merged(seed):
    """A slow GPU on node-1 and a slow NIC on node-5: two suspects, not their host or leaf."""
    gpu = UnitFault("gpu", RANKS[9].placement["gpu"], factor=1.5, start=10)
    nic = UnitFault("nic", "node-5/mlx5_3", factor=3, start=10)
    named = {(s["unit_kind"], s["unit"]) for s in _suspects([gpu, nic], seed)}
    assert named == {("gpu", gpu.name), ("nic", nic.name)}


def test_the_leaf_switch_preset_names_its_leaf_through_the_cli(tmp_path):
    out = tmp_path / "trace"
    cli = [sys.executable, "-m", "argus_core.cli"]
    subprocess.run([*cli, "simulate", "--case", "leaf-switch", "--out", str(out)], check=True,
                   capture_output=True)
    doc = json.loads(subprocess.run([*cli, "diagnose", str(out), "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    (suspect,) = doc["suspects"]
    assert suspect["unit_kind"] == "leaf" and suspect["unit"] == "leaf-1"
    assert suspect["ranks"] == list(range(48, 64)) and suspect["cause"] == "communication"
    assert suspect["hosts"] == ["node-6", "node-7"]
    assert "the 48 ranks under other leaf switches are healthy" in suspect["evidence"]
    assert {v["rank"] for v in doc["verdict"]} == set(range(48, 64))  # fixed fields unchanged


def _ranks(hosts: int, per_host: int = 8, **placement) -> dict[int, RankRecord]:
    return {h * per_host + g: RankRecord("j", h * per_host + g, hosts * per_host, f"h{h}", g,
                                         (0, 0, 0, 0), dict(placement))
            for h in range(hosts) for g in range(per_host)}


def test_healthy_ranks_under_a_unit_are_counted_against_it():
    """Six of host h2's eight ranks slow: the host is named, its two healthy ranks reported."""
    ranks = _ranks(8)
    flagged = [(r, "compute") for r in range(16, 22)]
    (suspect,) = attribute(ranks, flagged, ranks)
    assert (suspect.unit_kind, suspect.unit, suspect.healthy) == ("host", "h2", 2)
    assert suspect.shared and suspect.p_value < 1e-6
    assert "2 healthy ranks under it" in suspect.evidence


def test_a_unit_mostly_healthy_is_not_named():
    """Twenty slow ranks, one on each of 20 hosts of a leaf of 256: beyond chance under that
    leaf, but under a tenth of its ranks (``min_share``): each rank's own GPU instead."""
    ranks = _ranks(64)
    for r, info in ranks.items():
        ranks[r] = RankRecord(**{**info.__dict__, "placement": {"leaf": f"leaf-{r // 256}"}})
    flagged = [(h * 8, "communication") for h in range(20)]
    suspects = attribute(ranks, flagged, ranks)
    assert [(s.unit_kind, s.shared) for s in suspects] == [("gpu", False)] * 20


def test_three_slow_ranks_of_one_host_name_the_host():
    """Three of a host's eight ranks, and none elsewhere in 64: chance would put them on one
    host 0.13% of the time, so the host is named, its five healthy ranks against it."""
    ranks = _ranks(8)
    (suspect,) = attribute(ranks, [(r, "compute") for r in (16, 18, 20)], ranks)
    assert (suspect.unit_kind, suspect.unit, suspect.healthy) == ("host", "h2", 5)


def test_a_host_process_fault_on_one_rank_names_no_hardware():
    ranks = _ranks(4)
    assert attribute(ranks, [(5, "host")], ranks) == []


def test_units_with_the_same_ranks_are_named_as_alternatives():
    """Every rank of a host behind one NIC and one PCIe switch: for communication the NIC is
    named, the switch and the host given as the same ranks."""
    ranks = _ranks(8, nic="mlx5_0", pcie_switch="0000:16:00.0", leaf="leaf-0")
    (suspect,) = attribute(ranks, [(r, "communication") for r in range(8, 16)], ranks)
    assert (suspect.unit_kind, suspect.unit) == ("nic", "h1/mlx5_0")
    assert set(suspect.alternatives) == {"PCIe switch h1/0000:16:00.0", "host h1"}


def test_independent_faults_in_a_big_job_are_not_a_shared_unit():
    """Two slow GPUs under one leaf of 512 ranks: chance, not the leaf."""
    ranks = _ranks(64, leaf="leaf-0")
    suspects = attribute(ranks, [(3, "compute"), (300, "compute")], ranks)
    assert [(s.unit_kind, s.shared) for s in suspects] == [("gpu", False), ("gpu", False)]


def test_placement_in_the_rank_record_is_checked_and_kept():
    record = {"v": 1, "kind": "rank", "job": "j", "rank": 1, "world_size": 2, "host": "h1",
              "placement": {"gpu": "GPU-1", "numa": 1, "leaf": "leaf-07", "future_key": "x"}}
    assert parse_record(record).placement == {"gpu": "GPU-1", "numa": 1, "leaf": "leaf-07"}
    with pytest.raises(SchemaError, match=r"placement\.numa"):
        parse_record({**record, "placement": {"numa": "one"}})
    with pytest.raises(SchemaError, match=r"placement\.nic"):
        parse_record({**record, "placement": {"nic": ""}})
    with pytest.raises(SchemaError, match="placement: expected an object"):
        parse_record({**record, "placement": ["mlx5_0"]})
    assert parse_record({k: v for k, v in record.items() if k != "placement"}).placement == {}


def test_hardware_fault_specs_parse_and_refuse_clearly():
    fault = parse_unit_fault("unit:kind=pcie_switch:name=node-2/0000:55:00.0:factor=4:from=3")
    assert (fault.kind, fault.name, fault.factor, fault.start) == (
        "pcie_switch", "node-2/0000:55:00.0", 4.0, 3)
    with pytest.raises(ValueError, match="kind 'switch'"):
        parse_unit_fault("unit:kind=switch:name=x")
    with pytest.raises(ValueError, match="unknown key 'speed'"):
        parse_unit_fault("unit:kind=leaf:name=leaf-1:speed=2")
    with pytest.raises(ValueError, match="no rank runs under leaf 'leaf-9'"):
        UnitFault("leaf", "leaf-9").faults(RANKS)
