"""Placement discovery (exporters/placement.py, pcie.py, netpos.py) on recorded hosts.

The /sys trees are built here in tmp_path as the kernel lays them out (devices under their
bridges, ``bus/pci/devices`` and ``class/infiniband`` as relative links); nvidia-smi outputs,
the Slurm topology.conf, the map and node labels are recorded under tests/data/topology/.
Nothing reads this machine's /sys, NVML or nvidia-smi.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from argus_exporters import netpos, pcie, placement
from argus_exporters.clock import HostClock
from argus_exporters.config import ConfigError, Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.placement import Sources, discover
from argus_exporters.records import rank_record
from argus_exporters.tracer import Tracer

DATA = Path(__file__).parent / "data" / "topology"
DGX_NICS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-8f2c-1d3e-a000-0000000000{i:02d}"


# -- recorded /sys trees -----------------------------------------------------------------
class FakeHost:
    """A /sys (and /proc/driver/nvidia) tree under ``root``."""

    def __init__(self, root: Path):
        self.sys = root / "sys"
        self.proc = root / "proc"
        (self.sys / "bus" / "pci" / "devices").mkdir(parents=True)

    def device(self, chain: list[str], vendor: str, cls: str, numa: int,
               model: str = "0x0000") -> Path:
        """A PCI function at ``chain`` (host bridge first, the function last)."""
        path = self.sys.joinpath("devices", *chain)
        path.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("class", cls), ("device", model),
                            ("numa_node", str(numa))):
            (path / name).write_text(value + "\n")
        link = self.sys / "bus" / "pci" / "devices" / chain[-1]
        link.symlink_to(os.path.relpath(path, link.parent))
        return path

    def bridge(self, chain: list[str], numa: int) -> None:
        self.device(chain, "0x1000", "0x060400", numa)

    def gpu(self, chain: list[str], numa: int, index: int | None = None) -> None:
        self.device(chain, "0x10de", "0x030200", numa, "0x2330")
        if index is not None:
            info = self.proc / "driver" / "nvidia" / "gpus" / chain[-1]
            info.mkdir(parents=True)
            (info / "information").write_text(
                f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t {uuid(index)}\n"
                f"Bus Location: \t {chain[-1]}\n")

    def nic(self, chain: list[str], numa: int, name: str, kind: str = "infiniband") -> None:
        path = self.device(chain, "0x15b3", "0x020700", numa, "0x1021")
        own = path / kind / name
        own.mkdir(parents=True)
        (own / "device").symlink_to(f"../../../{chain[-1]}")
        folder = self.sys / "class" / kind
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(os.path.relpath(own, folder))

    def sources(self, **overrides) -> Sources:
        return Sources(**{"sys_root": str(self.sys), "proc_root": str(self.proc), "nvml": None,
                          "smi": None, "slurm_default": None, **overrides})


def dgx_host(root: Path) -> FakeHost:
    """8 GPUs behind 4 PCIe switches (2 per socket), one mlx5 NIC per switch, an NVSwitch
    (a bridge-class NVIDIA device, not a GPU), NVMe and a management NIC (class/net only)."""
    host = FakeHost(root)
    gpu = 0
    for switch, base in enumerate((0x16, 0x3a, 0x96, 0xba)):
        numa = switch // 2
        top = ["pci0000:00" if numa == 0 else "pci0000:80",
               f"0000:{0 if numa == 0 else 0x80:02x}:{1 + 2 * (switch % 2):02x}.0"]
        up = f"0000:{base:02x}:00.0"
        host.bridge(top, numa)
        host.bridge([*top, up], numa)
        downs = [f"0000:{base + 1:02x}:{d:02x}.0" for d in range(3)]
        for down in downs:
            host.bridge([*top, up, down], numa)
        host.gpu([*top, up, downs[0], f"0000:{base + 2:02x}:00.0"], numa, gpu)
        host.nic([*top, up, downs[1], f"0000:{base + 3:02x}:00.0"], numa, f"mlx5_{switch}")
        host.gpu([*top, up, downs[2], f"0000:{base + 4:02x}:00.0"], numa, gpu + 1)
        gpu += 2
    host.device(["pci0000:00", "0000:00:05.0", "0000:05:00.0"], "0x10de", "0x068000", 0)
    host.device(["pci0000:00", "0000:00:06.0", "0000:06:00.0"], "0x144d", "0x010802", 0)
    host.nic(["pci0000:00", "0000:00:07.0", "0000:07:00.0"], 0, "eno1", kind="net")
    return host


DGX_BUS = ["0000:18:00.0", "0000:1a:00.0", "0000:3c:00.0", "0000:3e:00.0",
           "0000:98:00.0", "0000:9a:00.0", "0000:bc:00.0", "0000:be:00.0"]
DGX_SWITCH = ["0000:16:00.0", "0000:3a:00.0", "0000:96:00.0", "0000:ba:00.0"]


def no_nic_host(root: Path) -> FakeHost:
    """GPU0 behind a switch, GPU1 straight on a root port, no RDMA device; eth0 on another
    root port shares no bridge with either GPU; lo has no device."""
    host = FakeHost(root)
    host.bridge(["pci0000:00", "0000:00:01.0"], 0)
    host.bridge(["pci0000:00", "0000:00:01.0", "0000:01:00.0"], 0)
    host.bridge(["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0"], 0)
    host.gpu(["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"], 0)
    host.bridge(["pci0000:00", "0000:00:02.0"], -1)
    host.gpu(["pci0000:00", "0000:00:02.0", "0000:04:00.0"], -1)
    host.nic(["pci0000:00", "0000:00:03.0", "0000:05:00.0"], 0, "eth0", kind="net")
    (host.sys / "class" / "net" / "lo").mkdir()
    return host


def cpu_host(root: Path) -> FakeHost:
    """No GPU at all: a SATA controller and one Ethernet NIC."""
    host = FakeHost(root)
    host.device(["pci0000:00", "0000:00:17.0"], "0x8086", "0x010601", 0)
    host.nic(["pci0000:00", "0000:00:1c.0", "0000:02:00.0"], 0, "eth0", kind="net")
    return host


def ident(local_rank: int = 0, host: str = "node-0") -> RankIdentity:
    return RankIdentity("job", local_rank, 8, local_rank, host,
                        {"dp": local_rank, "tp": 0, "pp": 0, "ep": 0})


# -- /sys ----------------------------------------------------------------------------------
@pytest.mark.parametrize("local_rank", range(8))
def test_dgx_each_gpu_gets_its_switchs_nic(tmp_path, local_rank):
    """Every GPU's NIC is the one behind its own switch; the switch is its upstream port;
    UUIDs come from /proc, NUMA nodes from /sys."""
    host = dgx_host(tmp_path)
    got = discover(ident(local_rank), {}, host.sources())
    switch = local_rank // 2
    assert got == {"gpu": uuid(local_rank), "pci_bus": DGX_BUS[local_rank],
                   "numa": switch // 2, "nic": f"mlx5_{switch}",
                   "pcie_switch": DGX_SWITCH[switch]}


@pytest.mark.parametrize("visible, local_rank, gpu", [
    ("4,5,6,7", 1, 5),  # the local_rank-th visible device
    ("7", 3, 7),  # one GPU per rank (Slurm's --gpus-per-task): that one, whatever LOCAL_RANK
    (f"{uuid(6)},{uuid(2)}", 1, 2),  # UUIDs
    (f"{uuid(3)[:12]}", 0, 3),  # a UUID prefix, as CUDA takes it
    ("2,x,3", 0, 2),  # CUDA stops at the first bad entry: only "2" is visible
])
def test_cuda_visible_devices_remaps(tmp_path, visible, local_rank, gpu):
    host = dgx_host(tmp_path)
    got = discover(ident(local_rank), {"CUDA_VISIBLE_DEVICES": visible}, host.sources())
    assert got["pci_bus"] == DGX_BUS[gpu] and got["gpu"] == uuid(gpu)
    assert got["nic"] == f"mlx5_{gpu // 2}"


@pytest.mark.parametrize("visible, local_rank", [("", 0), ("0,1", 2), ("GPU-ffff", 0)])
def test_no_visible_gpu_gives_no_gpu_keys(tmp_path, visible, local_rank):
    host = dgx_host(tmp_path)
    assert discover(ident(local_rank), {"CUDA_VISIBLE_DEVICES": visible}, host.sources()) == {}


def test_gpus_without_nic(tmp_path):
    """No RDMA device and no NIC sharing a bridge: no nic; the switch is the GPU's own, or
    absent for a GPU on a root port; numa_node -1 leaves numa out."""
    host = no_nic_host(tmp_path)
    assert discover(ident(0), {}, host.sources()) == {
        "pci_bus": "0000:03:00.0", "numa": 0, "pcie_switch": "0000:01:00.0"}
    assert discover(ident(1), {}, host.sources()) == {"pci_bus": "0000:04:00.0"}


def test_nvidia_smi_names_the_nic_when_sys_does_not(tmp_path):
    """nvidia-smi topo -m is read only when /sys named no NIC, for this GPU's row."""
    host = no_nic_host(tmp_path)
    text = (DATA / "nvidia-smi-topo-4gpu-2nic.txt").read_text()
    calls = []

    def smi():
        calls.append(1)
        return text

    assert discover(ident(1), {}, host.sources(smi=smi))["nic"] == "mlx5_0"
    assert discover(ident(0), {}, dgx_host(tmp_path / "dgx").sources(smi=smi))["nic"] == \
        "mlx5_0"
    assert len(calls) == 1


def test_cpu_only_host_gives_nothing_or_only_the_network(tmp_path):
    host = cpu_host(tmp_path)
    assert discover(ident(0), {}, host.sources()) == {}
    env = {"ARGUS_TOPOLOGY": str(DATA / "topology-map.yaml")}
    assert discover(ident(0, "h064"), env, host.sources()) == {
        "rack": "r07", "leaf": "leaf-07", "spine": "spine-1"}


def test_missing_sys_root_is_not_an_error(tmp_path):
    sources = Sources(sys_root=str(tmp_path / "none"), proc_root=str(tmp_path / "none"),
                      nvml=None, smi=None, slurm_default=None)
    assert discover(ident(0), {}, sources) == {}


def test_mixed_gpu_models_need_pci_bus_order(tmp_path):
    """/sys's order is CUDA's only for one model (or CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    host = no_nic_host(tmp_path)
    (host.sys / "bus" / "pci" / "devices" / "0000:04:00.0" / "device").write_text("0x2684\n")
    assert discover(ident(1), {}, host.sources()) == {}
    assert discover(ident(1), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                    host.sources())["pci_bus"] == "0000:04:00.0"


# -- NVML --------------------------------------------------------------------------------
class FakeNvml:
    """The few pynvml calls discovery makes, over DGX's GPUs (bus ids as NVML spells them)."""

    def __init__(self, fail_init: bool = False):
        self.fail_init = fail_init
        self.shut = False

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):  # noqa: N802
        self.shut = True

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 8

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        kind, i = handle[0], handle[1]
        return uuid(i) if kind == "gpu" else f"MIG-{i}-{handle[2]}".encode()

    def nvmlDeviceGetPciInfo(self, handle):  # noqa: N802
        return SimpleNamespace(busId=("0000" + DGX_BUS[handle[1]].upper()).encode())

    def nvmlDeviceGetNumaNodeId(self, handle):  # noqa: N802
        return 7 if handle[1] == 0 else -1

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):  # noqa: N802
        if handle[1] != 6:
            raise RuntimeError("Not Supported")
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, j):  # noqa: N802
        return ("mig", handle[1], j)


def test_nvml_gives_uuid_bus_and_numa(tmp_path):
    """NVML's bus id (8-digit domain, upper case) is normalised and found in /sys; its NUMA
    node wins over /sys's, and /sys's is used when NVML has none."""
    host = dgx_host(tmp_path)
    nvml = FakeNvml()
    got = discover(ident(0), {}, host.sources(nvml=nvml, proc_root=str(tmp_path / "none")))
    assert got == {"gpu": uuid(0), "pci_bus": DGX_BUS[0], "numa": 7, "nic": "mlx5_0",
                   "pcie_switch": DGX_SWITCH[0]}
    assert nvml.shut
    assert discover(ident(4), {}, host.sources(nvml=nvml))["numa"] == 1


def test_a_mig_instance_is_placed_on_its_gpu(tmp_path):
    host = dgx_host(tmp_path)
    got = discover(ident(0), {"CUDA_VISIBLE_DEVICES": "MIG-6-1"}, host.sources(nvml=FakeNvml()))
    assert got["pci_bus"] == DGX_BUS[6] and got["nic"] == "mlx5_3"


def test_nvml_failing_falls_back_to_sys(tmp_path):
    host = dgx_host(tmp_path)
    got = discover(ident(2), {}, host.sources(nvml=FakeNvml(fail_init=True)))
    assert got["pci_bus"] == DGX_BUS[2] and got["gpu"] == uuid(2)


@pytest.mark.parametrize("text, bus", [("00000000:1A:00.0", "0000:1a:00.0"),
                                       ("1a:00.0", "0000:1a:00.0"),
                                       ("0001:B3:1F.7", "0001:b3:1f.7"), ("GPU-1", None)])
def test_bus_ids_are_normalised(text, bus):
    assert pcie.normalize_bus_id(text) == bus


# -- nvidia-smi topo -m --------------------------------------------------------------------
def test_topo_dgx_h100_each_gpu_its_pix_nic():
    """The DGX H100-like recording (header underlined with ANSI codes, a NIC legend with
    non-consecutive mlx5 names): every GPU's PIX NIC, by its legend name."""
    text = (DATA / "nvidia-smi-topo-dgx-h100.txt").read_text()
    matrix = pcie.parse_topo_matrix(text)
    assert matrix.columns[:8] == [f"GPU{i}" for i in range(8)] and len(matrix.columns) == 16
    assert [pcie.nearest_nic_in_topo(text, i) for i in range(8)] == DGX_NICS
    assert pcie.nearest_nic_in_topo(text, 8) is None


def test_topo_4gpu_2nic_pxb_before_sys():
    text = (DATA / "nvidia-smi-topo-4gpu-2nic.txt").read_text()
    assert [pcie.nearest_nic_in_topo(text, i) for i in range(4)] == \
        ["mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1"]


def test_topo_old_format_names_nics_in_the_header():
    """Older drivers: the NIC's device name is its column, no legend; PHB beats NODE."""
    text = ("        GPU0    GPU1    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity\n"
            "GPU0     X      NV2     NODE    PHB     0-23    0\n"
            "GPU1    NV2      X      SYS     SYS     0-23    0\n"
            "mlx5_0  NODE    SYS      X      NODE\n")
    assert pcie.nearest_nic_in_topo(text, 0) == "mlx5_1"
    assert pcie.nearest_nic_in_topo(text, 1) == "mlx5_0"
    assert pcie.nearest_nic_in_topo("garbage\n", 0) is None


def test_run_topo_without_nvidia_smi_on_path(tmp_path):
    assert pcie.run_topo(path=str(tmp_path)) is None


def test_run_topo_runs_nvidia_smi_topo(tmp_path):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'topo -m' ] && cat "
                   f"'{DATA / 'nvidia-smi-topo-4gpu-2nic.txt'}'\n")
    exe.chmod(0o755)
    assert pcie.nearest_nic_in_topo(pcie.run_topo(path=str(tmp_path)), 3) == "mlx5_1"


# -- the YAML map --------------------------------------------------------------------------
@pytest.mark.parametrize("host, want", [
    ("h064", {"rack": "r07", "leaf": "leaf-07", "spine": "spine-1"}),  # exact
    ("h064.cluster.local", {"rack": "r07", "leaf": "leaf-07", "spine": "spine-1"}),  # short
    ("h065.cluster.local", {"rack": "r07", "leaf": "leaf-07", "spine": "spine-1"}),  # full
    ("h066", {"rack": "r07", "leaf": "leaf-07b", "spine": "spine-1"}),  # the first glob
    ("h100", {"spine": "spine-0"}),  # a later glob
    ("x1", {}),
])
def test_map_exact_host_then_globs(host, want):
    assert netpos.from_map(str(DATA / "topology-map.yaml"), netpos.host_names(host)) == want


@pytest.mark.parametrize("body, what", [
    ("hosts: [h1, h2]\n", "hosts: expected a mapping"),
    ("hosts:\n  h1: {rack: 07}\n", "hosts.h1.rack: expected a string"),
    ("hosts:\n  h1: {rak: r1}\n", "unknown key 'rak'"),
    ("patterns:\n  - {rack: r1}\n", "patterns[0]: expected a mapping with a 'match'"),
    ("hosts: {h1: [\n", "not YAML"),
    ("- a\n- b\n", "expected a mapping with 'hosts'"),
])
def test_bad_map_names_the_file_and_what_is_wrong(tmp_path, caplog, body, what):
    path = tmp_path / "map.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=r"ARGUS_TOPOLOGY=.*map\.yaml") as info:
        netpos.load_map(str(path))
    assert what in str(info.value)
    with caplog.at_level(logging.WARNING, "argus_exporters"):
        got = discover(ident(0, "h1"), {"ARGUS_TOPOLOGY": str(path)},
                       cpu_host(tmp_path / "h").sources())
    assert got == {}
    assert str(path) in caplog.text and what in caplog.text


def test_unreadable_or_huge_map_is_logged_not_raised(tmp_path, caplog):
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (netpos.MAX_FILE_BYTES + 1))
    sources = cpu_host(tmp_path / "h").sources()
    with caplog.at_level(logging.WARNING, "argus_exporters"):
        assert discover(ident(0), {"ARGUS_TOPOLOGY": str(tmp_path / "missing.yaml")},
                        sources) == {}
        assert discover(ident(0), {"ARGUS_TOPOLOGY": str(huge)}, sources) == {}
    assert "missing.yaml: cannot be read" in caplog.text and "larger than" in caplog.text


# -- Slurm -------------------------------------------------------------------------------
@pytest.mark.parametrize("text, names", [
    ("h[064-067],h070", ["h064", "h065", "h066", "h067", "h070"]),
    ("gpu-r[1-2]-n[01-02]", ["gpu-r1-n01", "gpu-r1-n02", "gpu-r2-n01", "gpu-r2-n02"]),
    ("a[1,3-4,010]", ["a1", "a3", "a4", "a010"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("solo", ["solo"]),
    ("", []),
])
def test_hostlists_expand(text, names):
    assert netpos.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["h[5-3]", "h[1-", "h1]", "h[a-b]", "h[0-9999999]"])
def test_bad_hostlists_are_refused(text):
    with pytest.raises(ValueError):
        netpos.expand_hostlist(text)


@pytest.mark.parametrize("names, want", [
    (["h065"], {"leaf": "leaf07", "spine": "core"}),  # leaf07 -> spine1 -> core: top-most
    (["h070"], {"leaf": "leaf07", "spine": "core"}),
    (["h000"], {"leaf": "leaf00", "spine": "core"}),
    (["gpu-r2-n01"], {"leaf": "leaf08", "spine": "core"}),  # lower-case keys
    (["solo01"], {"leaf": "lonely"}),  # no switch above
    (["h068"], {}),
])
def test_slurm_leaf_and_spine(names, want):
    assert netpos.from_slurm(str(DATA / "slurm-topology.conf"), names) == want


def test_slurm_node_name_and_default_path(tmp_path):
    """SLURMD_NODENAME is looked up first; the default topology.conf is read when present."""
    conf = str(DATA / "slurm-topology.conf")
    assert netpos.position("node-17.cluster", {"SLURMD_NODENAME": "h064"}, conf) == \
        {"leaf": "leaf07", "spine": "core"}
    assert netpos.position("h064", {}, str(tmp_path / "absent.conf")) == {}


def test_first_source_that_places_the_host_wins(tmp_path):
    env = {"ARGUS_TOPOLOGY": str(DATA / "topology-map.yaml"),
           "ARGUS_SLURM_TOPOLOGY": str(DATA / "slurm-topology.conf"),
           "ARGUS_NODE_LABELS": str(DATA / "node-labels-aws.txt")}
    assert netpos.position("h064", env, None)["leaf"] == "leaf-07"  # the map
    assert netpos.position("gpu-r1-n01", env, None) == {"leaf": "leaf08", "spine": "core"}
    assert netpos.position("other", env, None)["leaf"] == "nn-1a2b3c4d5e6f70003"


# -- node labels -------------------------------------------------------------------------
def test_aws_labels_deepest_layer_leaf_top_layer_spine():
    labels = netpos.parse_labels((DATA / "node-labels-aws.txt").read_text())
    assert labels["kubernetes.io/hostname"] == "ip-10-1-2-3.ec2.internal"
    assert netpos.from_labels(labels) == {"leaf": "nn-1a2b3c4d5e6f70003",
                                          "spine": "nn-1a2b3c4d5e6f70001"}
    four = {**labels, "topology.k8s.aws/network-node-layer-4": "nn-4"}
    assert netpos.from_labels(four)["leaf"] == "nn-4"


def test_gke_labels_subblock_leaf_block_spine():
    labels = netpos.parse_labels((DATA / "node-labels-gke.txt").read_text())
    assert netpos.from_labels(labels) == {"leaf": "7b0d45", "spine": "3f6a1c"}


def test_argus_labels_win_and_quotes_are_go_quoted():
    text = ('topology.argus.io/rack="r\\"9"\n'
            'topology.argus.io/leaf="leaf-9"\n'
            'cloud.google.com/gce-topology-subblock="sb"\n'
            'cloud.google.com/gce-topology-block="b"\n'
            'no equals sign\n')
    assert netpos.from_labels(netpos.parse_labels(text)) == {
        "rack": 'r"9', "leaf": "leaf-9", "spine": "b"}


def test_node_labels_through_discover(tmp_path):
    env = {"ARGUS_NODE_LABELS": str(DATA / "node-labels-gke.txt")}
    got = discover(ident(3), env, dgx_host(tmp_path).sources())
    assert got["nic"] == "mlx5_1" and got["leaf"] == "7b0d45" and got["spine"] == "3f6a1c"


# -- bounds and the record -----------------------------------------------------------------
def test_values_are_bounded():
    assert placement.bounded({"gpu": "G" * 4097, "nic": "", "numa": -1, "leaf": "l",
                              "rack": 5, "spine": "s" * 4096}) == {"leaf": "l",
                                                                   "spine": "s" * 4096}
    assert placement.bounded({"numa": True}) == {} and placement.bounded({"numa": 3}) == \
        {"numa": 3}


def test_rank_record_carries_placement_only_when_known():
    assert "placement" not in rank_record(ident(0))
    record = rank_record(RankIdentity("j", 5, 16, 5, "node-1", {"dp": 1, "tp": 1, "pp": 0,
                                                                 "ep": 0},
                                      placement={"nic": "mlx5_0", "numa": 0}))
    assert record["placement"] == {"nic": "mlx5_0", "numa": 0}


def test_placement_setting():
    assert Settings.from_env({}).placement
    assert not Settings.from_env({"ARGUS_PLACEMENT": "0"}).placement
    assert not Settings().placement  # built in code: asks for it
    with pytest.raises(ConfigError, match="ARGUS_PLACEMENT"):
        Settings.from_env({"ARGUS_PLACEMENT": "sometimes"})


# -- through the Tracer --------------------------------------------------------------------
def rank_records(spool: Path) -> list[dict]:
    records = [orjson.loads(line) for path in sorted(spool.rglob("*.ndjson"))
               for line in path.read_bytes().splitlines()]
    return [r for r in records if r["kind"] == "rank"]


def tracer_settings(tmp_path: Path, **overrides) -> Settings:
    return Settings(enabled=True, sink=f"file://{tmp_path / 'spool'}", flush_s=0.05,
                    **overrides)


def test_tracer_emits_a_rank_record_with_placement(tmp_path):
    """The first rank record goes out at once; discovery, on its own thread, adds a second
    one with the placement from the ARGUS_TOPOLOGY map and the recorded /sys tree."""
    host = dgx_host(tmp_path / "host")
    env = {"ARGUS_TOPOLOGY": str(DATA / "topology-map.yaml")}
    find = functools.partial(discover, env=env, sources=host.sources())
    identity = RankIdentity("job-p", 5, 16, 5, "h064", {"dp": 5, "tp": 0, "pp": 0, "ep": 0})
    tracer = Tracer(tracer_settings(tmp_path, placement=True), identity, clock=HostClock(),
                    discover=find)
    deadline = time.monotonic() + 10
    while not tracer.identity.placement and time.monotonic() < deadline:
        time.sleep(0.01)
    with tracer.phase("forward"):
        pass
    tracer.step()
    tracer.shutdown()
    first, second = rank_records(tmp_path / "spool")
    assert "placement" not in first
    assert second["placement"] == {"gpu": uuid(5), "pci_bus": DGX_BUS[5], "numa": 1,
                                   "nic": "mlx5_2", "pcie_switch": DGX_SWITCH[2],
                                   "rack": "r07", "leaf": "leaf-07", "spine": "spine-1"}
    assert second["coords"] == first["coords"] and second["rank"] == 5


def test_tracer_never_waits_for_discovery(tmp_path):
    """A discovery that hangs does not hold the constructor or the training thread; the
    coordinates learned meanwhile are kept in the later record."""
    release = threading.Event()

    def slow(identity):
        release.wait(10)
        return {"rack": "r1"}

    started = time.monotonic()
    tracer = Tracer(tracer_settings(tmp_path, placement=True), ident(0), clock=HostClock(),
                    discover=slow)
    assert time.monotonic() - started < 1.0
    tracer.update_coords({"dp": 0, "tp": 1, "pp": 0, "ep": 0})
    release.set()
    deadline = time.monotonic() + 10
    while not tracer.identity.placement and time.monotonic() < deadline:
        time.sleep(0.01)
    tracer.shutdown()
    last = rank_records(tmp_path / "spool")[-1]
    assert last["placement"] == {"rack": "r1"} and last["coords"]["tp"] == 1


@pytest.mark.parametrize("found", [{}, RuntimeError("boom")])
def test_tracer_nothing_found_or_a_failure_emits_one_rank_record(tmp_path, found):
    done = threading.Event()

    def find(identity):
        done.set()
        if isinstance(found, Exception):
            raise found
        return found

    tracer = Tracer(tracer_settings(tmp_path, placement=True), ident(0), clock=HostClock(),
                    discover=find)
    assert done.wait(10)
    time.sleep(0.05)
    tracer.shutdown()
    assert len(rank_records(tmp_path / "spool")) == 1


def test_tracer_placement_off(tmp_path):
    called = []
    tracer = Tracer(tracer_settings(tmp_path, placement=False), ident(0), clock=HostClock(),
                    discover=lambda identity: called.append(1) or {"rack": "r"})
    time.sleep(0.05)
    tracer.shutdown()
    assert not called and len(rank_records(tmp_path / "spool")) == 1
