"""Which PCIe switch and NIC sit nearest a GPU: from a ``/sys`` tree, or ``nvidia-smi topo -m``.

``/sys/bus/pci/devices/<bus>`` links to the device's real path, whose components are the
chain of bridges above it, root port first::

    /sys/devices/pci0000:00/0000:00:01.0/0000:16:00.0/0000:17:00.0/0000:1a:00.0
                            root port    switch up    switch down  the GPU

A NIC is ``/sys/class/infiniband/<name>/device`` (``/sys/class/net/<name>/device`` when the
host has no RDMA device). The nearest NIC is the one sharing the deepest bridge with the GPU
(ties: the lower name, naturally sorted: ``mlx5_2`` before ``mlx5_10``); no shared bridge, no
NIC. ``pcie_switch`` is that deepest shared bridge: behind one switch, the switch's upstream
port. Without a NIC it is the upstream port of the GPU's own switch (the bridge above its
downstream port), and absent when no switch sits between the GPU and its root port.

``nvidia-smi topo -m`` prints the same relationships as a matrix; :func:`nearest_nic_in_topo`
reads it when ``/sys`` names no NIC (a container with part of ``/sys``). Every read is bounded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

MAX_ATTR_BYTES = 4096  # a sysfs attribute (numa_node, vendor, class)
MAX_DEVICES = 4096  # PCI functions or NICs listed from one directory
MAX_TOPO_BYTES = 1 << 20  # nvidia-smi's output
TOPO_TIMEOUT_S = 2.0
# nvidia-smi topo's relationship codes, nearest first (NV# links GPUs, never a NIC)
RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")

_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_SYSFS_BUS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")  # a path component
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class PcieLocation:
    """Where a PCI device sits: its NUMA node, nearest NIC and the switch it shares with it."""

    numa: int | None = None
    nic: str | None = None
    pcie_switch: str | None = None


def normalize_bus_id(text: str) -> str | None:
    """``00000000:1A:00.0`` (NVML) or ``1a:00.0`` as sysfs names it, ``0000:1a:00.0``;
    None when ``text`` is no PCI address."""
    match = _BUS.match(text.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def read_attr(path: str) -> str | None:
    """A small sysfs attribute's text, stripped (at most MAX_ATTR_BYTES); None if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_ATTR_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return None


def device_chain(path: str) -> list[str]:
    """The PCI addresses on ``path``'s real path, root port first and the device itself last."""
    parts = os.path.realpath(path).split(os.sep)
    return [p for p in parts if _SYSFS_BUS.match(p)]


def pci_numa(sys_root: str, bus: str) -> int | None:
    """The device's NUMA node from ``numa_node`` (-1, unknown: None)."""
    raw = read_attr(os.path.join(sys_root, "bus", "pci", "devices", bus, "numa_node"))
    if raw is None or not raw.lstrip("-").isdecimal():
        return None
    node = int(raw)
    return node if node >= 0 else None


def list_nics(sys_root: str) -> dict[str, list[str]]:
    """Each NIC's PCI chain (its device last): RDMA devices, else network interfaces."""
    for kind in ("infiniband", "net"):
        folder = os.path.join(sys_root, "class", kind)
        try:
            names = sorted(os.listdir(folder))[:MAX_DEVICES]
        except OSError:
            continue
        chains = {}
        for name in names:
            link = os.path.join(folder, name, "device")
            if os.path.exists(link):  # virtual interfaces (lo, bonds, bridges) have none
                chain = device_chain(link)
                if chain:
                    chains[name] = chain
        if chains:
            return chains
    return {}


def _natural(name: str) -> list:
    return [int(part) if part.isdecimal() else part for part in re.split(r"(\d+)", name)]


def _shared(a: list[str], b: list[str]) -> int:
    """How many leading bridges two devices' chains (each without its device) share."""
    depth = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        depth += 1
    return depth


def locate(sys_root: str, bus: str) -> PcieLocation:
    """The NUMA node, nearest NIC and shared switch of PCI device ``bus`` under ``sys_root``
    (all None where ``/sys`` does not tell)."""
    link = os.path.join(sys_root, "bus", "pci", "devices", bus)
    if not os.path.exists(link):
        return PcieLocation()
    numa = pci_numa(sys_root, bus)
    bridges = device_chain(link)[:-1]
    best: tuple[int, list] | None = None
    nic = None
    for name, chain in list_nics(sys_root).items():
        depth = _shared(bridges, chain[:-1])
        if depth and (best is None or (-depth, _natural(name)) < best):
            best, nic = (-depth, _natural(name)), name
    if best is not None:
        switch = bridges[-best[0] - 1]
    else:  # the upstream port of the GPU's own switch (root port, up, down, ...)
        switch = bridges[-2] if len(bridges) >= 3 else None
    return PcieLocation(numa=numa, nic=nic, pcie_switch=switch)


@dataclass(frozen=True)
class TopoMatrix:
    """``nvidia-smi topo -m``: its device columns and each row's relationship per column."""

    columns: list[str]
    rows: dict[str, list[str]]
    nics: dict[str, str]  # NICk -> its device name (the "NIC Legend")


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m``'s matrix: columns are the words of the header before
    ``CPU Affinity``; rows start with a column's name; ``NICk: mlx5_k`` lines name the NICs
    (older drivers put the device name in the header itself). ANSI underlines are removed."""
    text = _ANSI.sub("", text)
    columns: list[str] = []
    rows: dict[str, list[str]] = {}
    nics: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        legend = _LEGEND.match(line)
        if legend:
            nics[legend.group(1)] = legend.group(2)
        elif not columns and words[0].startswith("GPU") and not line[:1].strip():
            for word in words:  # the header is indented: it has no row name
                if word in ("CPU", "NUMA"):
                    break
                columns.append(word)
        elif columns and words[0] in columns and len(words) > len(columns):
            rows[words[0]] = words[1:len(columns) + 1]
    return TopoMatrix(columns, rows, nics)


def nearest_nic_in_topo(text: str, gpu_index: int) -> str | None:
    """The NIC closest to GPU ``gpu_index`` (nvidia-smi's, i.e. NVML's, numbering) in
    ``nvidia-smi topo -m`` output: PIX before PXB, PHB, NODE, SYS; ties: the first column."""
    matrix = parse_topo_matrix(text)
    row = matrix.rows.get(f"GPU{gpu_index}")
    if row is None:
        return None
    best: tuple[int, str] | None = None
    for column, relation in zip(matrix.columns, row, strict=False):
        if column.startswith("GPU") or relation not in RELATIONS:
            continue
        rank = RELATIONS.index(relation)
        if best is None or rank < best[0]:
            best = (rank, matrix.nics.get(column, column))
    return best[1] if best else None


def run_topo(path: str | None = None) -> str | None:
    """``nvidia-smi topo -m``'s output when nvidia-smi is on ``path`` (PATH by default),
    within TOPO_TIMEOUT_S and MAX_TOPO_BYTES; None when it is missing or fails."""
    exe = shutil.which("nvidia-smi", path=path)
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, timeout=TOPO_TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout[:MAX_TOPO_BYTES].decode("utf-8", "replace")
