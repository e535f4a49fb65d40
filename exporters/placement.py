"""Where this rank runs: its GPU, the GPU's PCIe neighbourhood and the host's network position.

:func:`discover` returns the ``placement`` of the schema's ``rank`` record, every key
optional (what cannot be found is absent; a CPU-only host gives only its network position,
or ``{}``)::

    {"gpu": "GPU-8f2c...", "pci_bus": "0000:1a:00.0", "numa": 0, "nic": "mlx5_0",
     "pcie_switch": "0000:16:00.0", "rack": "r07", "leaf": "leaf-07", "spine": "spine-1"}

Which GPU: the LOCAL_RANK-th of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, as CUDA parses
them: up to the first bad entry), as torch's ``cuda:LOCAL_RANK``; a rank that sees a single
GPU has that one. Its UUID, PCI bus id and NUMA node come from NVML (``pynvml``, from
nvidia-ml-py, used only when importable); without it from ``/sys`` (NVIDIA display and 3D
controllers in PCI bus order, NVML's order, used only when they are all one model or
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, since CUDA orders mixed models fastest first) and the UUID
from ``/proc/driver/nvidia/gpus/<bus>/information``. Indices count in that order. The
NIC, switch and NUMA node (when NVML gave none) come from ``/sys`` (``pcie.py``), the NIC from
``nvidia-smi topo -m`` when ``/sys`` names none; the network position from ``netpos.py``.

It runs once, on the tracer's placement thread, never on the training thread: every source
is optional and bounded, and a failure is logged once and leaves its keys out, never raises.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from argus_exporters import netpos, pcie
from argus_exporters.identity import RankIdentity

logger = logging.getLogger("argus_exporters")

MAX_TEXT = 4096
MAX_NUMA = 2**31 - 1  # schema v1's integer bound
MAX_GPUS = 1024
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers
AUTO: Any = object()  # a Sources field left to find its default
_UUID = re.compile(r"^\s*GPU UUID\s*:\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Sources:
    """What discovery reads; tests point it at recorded trees and stand-ins.

    ``nvml``: the ``pynvml`` module (AUTO: imported if it can be, None: not used); ``smi``:
    returns ``nvidia-smi topo -m``'s text (AUTO: run it if on PATH, None: not used);
    ``slurm_default``: the topology.conf read without ARGUS_SLURM_TOPOLOGY (None: none).
    """

    sys_root: str = "/sys"
    proc_root: str = "/proc"
    nvml: Any = AUTO
    smi: Callable[[], str | None] | None = AUTO
    slurm_default: str | None = netpos.DEFAULT_SLURM_TOPOLOGY


@dataclass(frozen=True)
class Gpu:
    """One physical GPU, at its NVML index."""

    index: int
    uuid: str | None = None
    bus: str | None = None
    numa: int | None = None
    migs: tuple[str, ...] = ()  # UUIDs of its MIG instances


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: entries up to the first bad one (an index
    >= 0 or a ``GPU-``/``MIG-`` UUID prefix); None when unset (every device)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    devices = []
    for token in raw.split(","):
        token = token.strip()
        if token.isdecimal() or token.startswith(("GPU-", "MIG-")):
            devices.append(token)
        else:
            break
    return devices


def select_gpu(gpus: list[Gpu], local_rank: int, env: Mapping[str, str]) -> Gpu | None:
    """The GPU ``cuda:local_rank`` is, among ``gpus`` (NVML order); None if unknown."""
    visible = visible_devices(env)
    if visible is None:
        token = str(local_rank)
    elif len(visible) == 1:
        token = visible[0]
    elif local_rank < len(visible):
        token = visible[local_rank]
    else:
        return None
    if token.isdecimal():
        index = int(token)
        return gpus[index] if index < len(gpus) else None
    matches = [g for g in gpus if (g.uuid or "").startswith(token)
               or any(m.startswith(token) for m in g.migs)]
    return matches[0] if len(matches) == 1 else None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _maybe(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # an NVML call the driver or binding lacks
        return None


def nvml_gpus(nvml: Any) -> list[Gpu]:
    """Every GPU NVML lists, with UUID, bus id, NUMA node and MIG instances."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(min(int(nvml.nvmlDeviceGetCount()), MAX_GPUS)):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _maybe(lambda h=handle: _text(nvml.nvmlDeviceGetUUID(h)))
            info = _maybe(lambda h=handle: nvml.nvmlDeviceGetPciInfo(h))
            bus = pcie.normalize_bus_id(_text(info.busId)) if info is not None else None
            numa = _maybe(lambda h=handle: int(nvml.nvmlDeviceGetNumaNodeId(h)))
            migs = []
            for i in range(_maybe(lambda h=handle: int(nvml.nvmlDeviceGetMaxMigDeviceCount(h)))
                           or 0):
                mig = _maybe(lambda h=handle, i=i: nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
                mig_uuid = mig is not None and _maybe(lambda m=mig: nvml.nvmlDeviceGetUUID(m))
                if mig_uuid:
                    migs.append(_text(mig_uuid))
            gpus.append(Gpu(index, uuid, bus, numa if numa is not None and numa >= 0 else None,
                            tuple(migs)))
        return gpus
    finally:
        _maybe(nvml.nvmlShutdown)


def sysfs_gpus(sys_root: str, proc_root: str, env: Mapping[str, str]) -> list[Gpu]:
    """NVIDIA GPUs under ``sys_root`` in PCI bus order ([] when their models differ and
    ``CUDA_DEVICE_ORDER`` is not ``PCI_BUS_ID``), UUIDs from ``proc_root`` where it has them."""
    folder = os.path.join(sys_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(folder))[:pcie.MAX_DEVICES]
    except OSError:
        return []
    found, models = [], set()
    for name in names:
        base = os.path.join(folder, name)
        bus = pcie.normalize_bus_id(name)
        if (bus is None or pcie.read_attr(os.path.join(base, "vendor")) != NVIDIA_VENDOR
                or not (pcie.read_attr(os.path.join(base, "class")) or "").startswith(
                    GPU_CLASSES)):
            continue
        models.add(pcie.read_attr(os.path.join(base, "device")))
        found.append(bus)
    if len(models) > 1 and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        logger.debug("argus: placement: GPU models differ, CUDA's order is not /sys's")
        return []
    gpus = []
    for index, bus in enumerate(found[:MAX_GPUS]):
        info = pcie.read_attr(os.path.join(proc_root, "driver", "nvidia", "gpus", bus,
                                           "information"))
        match = _UUID.search(info or "")
        gpus.append(Gpu(index, match.group(1) if match else None, bus))
    return gpus


def _gpus(sources: Sources, env: Mapping[str, str]) -> list[Gpu]:
    nvml = sources.nvml
    if nvml is AUTO:
        try:
            import pynvml as nvml
        except Exception:  # not installed, or no driver library to bind
            nvml = None
    if nvml is not None:
        try:
            return nvml_gpus(nvml)
        except Exception as exc:
            logger.debug("argus: placement: NVML unavailable (%s), reading /sys", exc)
    return sysfs_gpus(sources.sys_root, sources.proc_root, env)


def _attempt(what: str, call: Callable[[], Any]) -> Any:
    """``call()``, or None with one debug line when it fails."""
    try:
        return call()
    except Exception as exc:
        logger.debug("argus: placement: %s failed: %r", what, exc)
        return None


def bounded(placement: dict) -> dict:
    """Keep the schema's keys: strings of 1 to MAX_TEXT characters, ``numa`` an int >= 0."""
    kept = {}
    for key, value in placement.items():
        if key == "numa":
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_NUMA:
                kept[key] = value
        elif isinstance(value, str) and 0 < len(value) <= MAX_TEXT:
            kept[key] = value
    return kept


def discover(identity: RankIdentity, env: Mapping[str, str] | None = None,
             sources: Sources | None = None) -> dict:
    """This rank's placement (module docstring); {} when nothing is known. Never raises."""
    try:
        return _discover(identity, os.environ if env is None else env, sources or Sources())
    except Exception:
        logger.warning("argus: placement discovery failed", exc_info=True)
        return {}


def _discover(identity: RankIdentity, env: Mapping[str, str], sources: Sources) -> dict:
    placement: dict[str, Any] = {}
    gpus = _attempt("GPU discovery", lambda: _gpus(sources, env)) or []
    gpu = select_gpu(gpus, identity.local_rank, env) if gpus else None
    if gpu is not None:
        placement.update(gpu=gpu.uuid, pci_bus=gpu.bus, numa=gpu.numa)
        where = gpu.bus and _attempt("/sys PCIe topology",
                                     lambda: pcie.locate(sources.sys_root, gpu.bus))
        if where:
            if placement["numa"] is None:
                placement["numa"] = where.numa
            placement.update(nic=where.nic, pcie_switch=where.pcie_switch)
        if not placement.get("nic") and sources.smi is not None:
            smi = pcie.run_topo if sources.smi is AUTO else sources.smi
            text = _attempt("nvidia-smi topo -m", smi)
            if text:
                placement["nic"] = _attempt("nvidia-smi topo -m parsing",
                                            lambda: pcie.nearest_nic_in_topo(text, gpu.index))
    network = _attempt("network position",
                       lambda: netpos.position(identity.host, env, sources.slurm_default))
    placement.update(network or {})
    return bounded(placement)
