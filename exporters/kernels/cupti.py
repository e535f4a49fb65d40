"""libcupti through ctypes: every CUPTI call the probe makes, with the GIL released.

cupti-python provides the record dtypes (``activity_kernel<N>_dtype``) and the library's
location; the calls themselves go through ctypes on the one libcupti of the process, as
torch's own CUPTI monitor does, so the GIL is released for the whole of every CUPTI call.
Tests pass the C stand-in for libcupti (tests/cupti_standin/) instead of the real library.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
import time
from typing import Any

import numpy as np

from argus_exporters.kernels.decode import RecordIndex, kernel_record_dtypes

CUPTI_SUCCESS = 0
CUPTI_ERROR_MAX_LIMIT_REACHED = 12  # cuptiActivityGetNextRecord: no more records
CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1  # cupti.cupti.ActivityFlag.FLUSH_FORCED
# CUPTI results that mean "someone else holds CUPTI" (cupti.cupti.Result values).
BUSY_STATUSES = {
    26: "ERROR_HARDWARE_BUSY",
    36: "ERROR_OLD_PROFILER_API_INITIALIZED",
    39: "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
}


class CuptiCallError(Exception):
    """A CUPTI call returned an error (``status`` is a CUptiResult, -1 when unknown)."""

    def __init__(self, status: int, where: str, detail: str = ""):
        name = BUSY_STATUSES.get(status) or detail or f"status {status}"
        super().__init__(f"{where}: {name}")
        self.status = status
        self.where = where


class ProbeUnavailableError(Exception):
    """The probe cannot run in this process; ``state`` and ``reason`` go to Health."""

    def __init__(self, state: str, reason: str):
        super().__init__(reason)
        self.state = state
        self.reason = reason


def state_for_status(status: int) -> str:
    """``busy`` for the CUPTI results that mean another client holds CUPTI, else unavailable."""
    return "busy" if status in BUSY_STATUSES else "unavailable"


def _mapped_libcupti() -> list[str]:
    """Real paths of the libcupti files mapped into this process (Linux /proc)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return []
    paths = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libcupti.so"):
            paths.add(os.path.realpath(parts[5].strip()))
    return sorted(paths)


def libcupti_path() -> str:
    """The process's libcupti: the one mapped, else the one cuda.pathfinder resolves (what
    cupti-python and torch load), else the linker's search; raises ProbeUnavailableError.

    Opening an already-loaded path returns the same handle: one CUPTI state, not two.
    """
    mapped = _mapped_libcupti()
    if len(mapped) == 1:
        return mapped[0]
    resolved = None
    with contextlib.suppress(Exception):
        from cuda.pathfinder import load_nvidia_dynamic_lib
        resolved = os.path.realpath(load_nvidia_dynamic_lib("cupti").abs_path)
    if mapped:
        if resolved in mapped:
            return resolved
        raise ProbeUnavailableError(
            "unavailable", f"several libcupti are loaded ({', '.join(mapped)}) and none is the "
                           "one cupti-python uses")
    path = resolved or ctypes.util.find_library("cupti")
    if not path:
        raise ProbeUnavailableError("unavailable", "libcupti not found")
    return path


def _gpu_problem() -> str | None:
    """Why there is no usable GPU here, or None (torch if loaded, else the driver via ctypes)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if not torch.cuda.is_available():
                return "no CUDA device (torch.cuda.is_available() is False)"
        except Exception as exc:
            return f"no CUDA device ({exc})"
        return None
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"no CUDA driver ({exc})"
    status = driver.cuInit(0)
    if status:
        return f"no CUDA device (cuInit returned CUresult {status})"
    count = ctypes.c_int(0)
    if driver.cuDeviceGetCount(ctypes.byref(count)) or count.value < 1:
        return "no CUDA device (cuDeviceGetCount is 0)"
    return None


def package_version(name: str) -> str | None:
    """An installed distribution's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "cuptiActivityRegisterCallbacks": ([ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    "cuptiActivityEnable": ([ctypes.c_int], ctypes.c_int),
    "cuptiActivityDisable": ([ctypes.c_int], ctypes.c_int),
    "cuptiActivityFlushAll": ([ctypes.c_uint32], ctypes.c_int),
    "cuptiActivityGetNextRecord": ([ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int),
    "cuptiActivityGetNumDroppedRecords": ([ctypes.c_void_p, ctypes.c_uint32,
                                           ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
    "cuptiGetTimestamp": ([ctypes.POINTER(ctypes.c_uint64)], ctypes.c_int),
    "cuptiGetVersion": ([ctypes.POINTER(ctypes.c_uint32)], ctypes.c_int),
}


class CuptiLibrary:
    """The CUPTI calls the probe makes, on one libcupti (``lib``) through ctypes."""

    def __init__(self, lib: ctypes.CDLL, dtypes: list[np.dtype], versions: str = ""):
        self.lib = lib
        self.path = getattr(lib, "_name", "libcupti")
        self._dtypes = dtypes
        self.versions = versions
        self.functions = {}
        for name, (argtypes, restype) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, restype
            self.functions[name] = function

    @classmethod
    def load(cls) -> CuptiLibrary:
        """cupti-python's dtypes and the process's libcupti; raises ProbeUnavailableError."""
        try:
            from cupti import cupti
        except Exception as exc:
            raise ProbeUnavailableError("unavailable",
                                        f"cupti-python is not installed ({exc})") from None
        problem = _gpu_problem()
        if problem:
            raise ProbeUnavailableError("unavailable", problem)
        try:
            path = libcupti_path()
            lib = ctypes.CDLL(path)
        except ProbeUnavailableError:
            raise
        except Exception as exc:
            raise ProbeUnavailableError("unavailable", f"libcupti via ctypes: {exc}") from None
        versions = (f"cupti-python {package_version('cupti-python')}, "
                    f"nvidia-cuda-cupti {package_version('nvidia-cuda-cupti')}")
        library = cls(lib, kernel_record_dtypes(cupti), versions)
        try:
            library.timestamp()  # initialises CUPTI, checks the driver
        except CuptiCallError as exc:
            raise ProbeUnavailableError(state_for_status(exc.status), f"CUPTI: {exc}") from None
        return library

    def _check(self, status: int, where: str) -> None:
        if status != CUPTI_SUCCESS:
            raise CuptiCallError(status, where)

    def record_dtypes(self) -> list[np.dtype]:
        """cupti-python's kernel record dtypes, newest first."""
        return list(self._dtypes)

    def register(self, request_address: int, complete_address: int) -> None:
        """Install native buffer callbacks (C function addresses); raises CuptiCallError."""
        self._check(self.functions["cuptiActivityRegisterCallbacks"](
            ctypes.c_void_p(request_address), ctypes.c_void_p(complete_address)),
            "cuptiActivityRegisterCallbacks")

    def enable(self, kind: int) -> None:
        """cuptiActivityEnable(kind); raises CuptiCallError."""
        self._check(self.functions["cuptiActivityEnable"](kind), "cuptiActivityEnable")

    def disable(self, kind: int) -> None:
        """cuptiActivityDisable(kind); raises CuptiCallError."""
        self._check(self.functions["cuptiActivityDisable"](kind), "cuptiActivityDisable")

    def flush(self, forced: bool) -> None:
        """cuptiActivityFlushAll: completed buffers (0), or every buffer (forced, at the end)."""
        flag = CUPTI_ACTIVITY_FLAG_FLUSH_FORCED if forced else 0
        self._check(self.functions["cuptiActivityFlushAll"](flag), "cuptiActivityFlushAll")

    def dropped_records(self, context: int, stream_id: int) -> int:
        """Records CUPTI dropped on (context, stream) since the last call (it resets them)."""
        dropped = ctypes.c_size_t(0)
        status = self.functions["cuptiActivityGetNumDroppedRecords"](
            ctypes.c_void_p(context or None), ctypes.c_uint32(stream_id), ctypes.byref(dropped))
        return int(dropped.value) if status == CUPTI_SUCCESS else 0

    def timestamp(self) -> int:
        """cuptiGetTimestamp in ns (CLOCK_REALTIME in CUPTI 13, unless a callback replaced it)."""
        value = ctypes.c_uint64(0)
        self._check(self.functions["cuptiGetTimestamp"](ctypes.byref(value)), "cuptiGetTimestamp")
        return int(value.value)

    def clock_offset_ns(self) -> int:
        """``time.time_ns() - cuptiGetTimestamp()``, the host read bracketing the CUPTI read."""
        before = time.time_ns()
        cupti = self.timestamp()
        after = time.time_ns()
        return (before + after) // 2 - cupti

    def next_record_address(self) -> int:
        """Address of cuptiActivityGetNextRecord (for the native walk)."""
        return ctypes.cast(self.functions["cuptiActivityGetNextRecord"], ctypes.c_void_p).value

    def index_records(self, address: int, valid_size: int, kind: int) -> RecordIndex:
        """Walk a buffer with cuptiActivityGetNextRecord from Python (no shim): one ctypes call
        per record, ~1 us each; used only for buffers that hold other record kinds."""
        next_record = self.functions["cuptiActivityGetNextRecord"]
        record = ctypes.c_void_p(None)
        offsets: list[int] = []
        kinds: dict[int, int] = {}
        all_offsets: list[int] = []
        while True:
            status = next_record(address, valid_size, ctypes.byref(record))
            if status == CUPTI_ERROR_MAX_LIMIT_REACHED:
                break
            if status != CUPTI_SUCCESS:
                raise CuptiCallError(status, "cuptiActivityGetNextRecord")
            offset = record.value - address
            record_kind = ctypes.c_uint32.from_address(record.value).value
            kinds[record_kind] = kinds.get(record_kind, 0) + 1
            all_offsets.append(offset)
            if record_kind == kind:
                offsets.append(len(all_offsets) - 1)
        ends = np.array([*all_offsets[1:], valid_size], dtype=np.int64)
        starts = np.array(all_offsets, dtype=np.int64)
        chosen = np.array(offsets, dtype=np.int64)
        return RecordIndex(starts[chosen], (ends - starts)[chosen], kinds)

    def version(self) -> int:
        """cuptiGetVersion (the CUPTI API version number), 0 when unknown."""
        value = ctypes.c_uint32(0)
        with contextlib.suppress(Exception):
            self.functions["cuptiGetVersion"](ctypes.byref(value))
        return int(value.value)

    def describe(self) -> str:
        """CUPTI API version, the library path and the packages' versions."""
        extra = f"; {self.versions}" if self.versions else ""
        return f"CUPTI API {self.version()} ({self.path}{extra})"
