"""GIL-free CUPTI buffer callbacks: torch's native plumbing, or the Argus C shim.

CUPTI calls the buffer callbacks from its own threads while holding its locks; a callback that
took the GIL could deadlock a training thread that holds the GIL and enters CUDA. Both
plumbings here keep Python out of the callbacks: the callback bodies are C/C++ that only move
pointers between a buffer pool and a completed queue; Python registers their addresses with
CUPTI and drains the queue from a decode thread with the GIL released while it waits.

- ``TorchPlumbing``: torch >= 2.13 ships them (``torch._C._profiler._cupti_monitor_*``). Its
  pool grows with demand (never refuses a buffer), so the probe bounds it from the outside
  (pauses tracing while too many buffers wait). It is a process-wide singleton shared with
  torch's own experimental CUPTI monitor: Argus never resets or shuts it down (that would free
  buffers CUPTI may hold); the decode thread is woken by a sentinel buffer instead.
- ``ShimPlumbing``: ``exporters/_native/cupti_shim.c`` through ctypes, for older torch: a fixed
  pool (a request is refused when every buffer is out; CUPTI then drops and counts records),
  foreign buffers ignored, a wait with a timeout, and the CUPTI record walk in C.

``select_plumbing`` picks one (``ARGUS_KERNEL_CALLBACKS``: auto, torch or shim).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from argus_exporters._native.build import ABI, SOURCE, ShimUnavailableError, open_library
from argus_exporters.kernels.cupti import ProbeUnavailableError
from argus_exporters.kernels.decode import RecordIndex

MODES = ("auto", "torch", "shim")
_KIND_SLOTS = 128
_TORCH_FUNCTIONS = ("_cupti_monitor_buffer_request_callback_address",
                    "_cupti_monitor_buffer_complete_callback_address",
                    "_cupti_monitor_get_completed", "_cupti_monitor_return_buffer",
                    "_cupti_monitor_configure_buffers", "_cupti_monitor_allocated_buffers",
                    "_cupti_monitor_pending_buffers")
_COMPLETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_size_t)


@dataclass(frozen=True)
class Completed:
    """One completed buffer handed over by CUPTI."""

    address: int
    valid_size: int
    context: int
    stream_id: int


class Stopped:
    """``get_completed`` after ``stop()`` once the queue is drained."""


STOPPED = Stopped()


class CallbackPlumbing(Protocol):
    """Native buffer callbacks plus the queue the decode thread drains."""

    name: str

    def callback_addresses(self) -> tuple[int, int]:
        """(request, complete) C function addresses for cuptiActivityRegisterCallbacks."""
        ...

    def configure(self, buffers: int, buffer_bytes: int) -> None:
        """Size the pool; raises ProbeUnavailableError."""
        ...

    def get_completed(self, timeout_s: float) -> Completed | Stopped | None:
        """The next completed buffer; None after ``timeout_s`` (where supported); STOPPED."""
        ...

    def return_buffer(self, address: int) -> None:
        """Give a decoded buffer back to the pool."""
        ...

    def pending(self) -> int:
        """Completed buffers waiting for the decode thread."""
        ...

    def stop(self) -> None:
        """Make ``get_completed`` return STOPPED once the queue is drained."""
        ...

    def release(self) -> bool:
        """Free the pool if CUPTI holds none of it; False when it is kept (CUPTI may write)."""
        ...

    def stats(self) -> dict[str, int]:
        """Pool and callback counters."""
        ...

    def index_records(self, next_record: int, address: int, valid_size: int,
                      kind: int) -> RecordIndex | None:
        """The walk in C (see ``decode``), or None where this plumbing has none."""
        ...


class TorchPlumbing:
    """torch's native CUPTI monitor buffer callbacks (torch >= 2.13)."""

    name = "torch native callbacks"
    _configured_bytes: int | None = None  # per process: Argus configured the singleton
    _sentinels: ClassVar[set[int]] = set()  # stop sentinels of every TorchPlumbing in this process
    _lock = threading.Lock()

    def __init__(self, profiler: object):
        self._p = profiler
        self._sentinel = ctypes.create_string_buffer(64)
        self._sentinel_address = ctypes.addressof(self._sentinel)
        TorchPlumbing._sentinels.add(self._sentinel_address)
        self._complete = _COMPLETE_FN(profiler._cupti_monitor_buffer_complete_callback_address())

    @classmethod
    def available(cls) -> TorchPlumbing | str:
        """The plumbing of the loaded torch, or why there is none."""
        torch = sys.modules.get("torch")
        if torch is None:
            return "torch is not loaded"
        profiler = getattr(getattr(torch, "_C", None), "_profiler", None)
        missing = [f for f in _TORCH_FUNCTIONS if not hasattr(profiler, f)]
        if missing:
            return (f"torch {getattr(torch, '__version__', '?')} has no native CUPTI callbacks "
                    "(torch >= 2.13 has)")
        return cls(profiler)

    def callback_addresses(self) -> tuple[int, int]:
        """torch's v1 request/complete callback addresses."""
        return (int(self._p._cupti_monitor_buffer_request_callback_address()),
                int(self._p._cupti_monitor_buffer_complete_callback_address()))

    def configure(self, buffers: int, buffer_bytes: int) -> None:
        """Set the buffer size once per process; refuse a pool someone else has filled."""
        with TorchPlumbing._lock:
            configured = TorchPlumbing._configured_bytes
            if configured is None:
                if int(self._p._cupti_monitor_allocated_buffers()):
                    raise ProbeUnavailableError(
                        "busy", "torch's CUPTI monitor buffers are in use by another client")
                self._p._cupti_monitor_configure_buffers(int(buffer_bytes))
                TorchPlumbing._configured_bytes = int(buffer_bytes)

    def get_completed(self, timeout_s: float) -> Completed | Stopped | None:
        """Blocks (GIL released) until a buffer or the stop sentinel arrives."""
        item = self._p._cupti_monitor_get_completed()
        if item is None:  # someone shut the singleton down
            return STOPPED
        address, valid_size, context, stream_id = (int(v) for v in tuple(item)[:4])
        if address == self._sentinel_address:
            return STOPPED
        if address in TorchPlumbing._sentinels:  # another probe's stop: pass it on
            self._complete(None, 0, address, 0, 0)
            return None
        return Completed(address, valid_size, context, stream_id)

    def return_buffer(self, address: int) -> None:
        """Back to torch's free list."""
        self._p._cupti_monitor_return_buffer(int(address))

    def pending(self) -> int:
        """torch's completed-queue length."""
        return int(self._p._cupti_monitor_pending_buffers())

    def stop(self) -> None:
        """Queue the sentinel through torch's own completion callback (no shutdown)."""
        self._complete(None, 0, self._sentinel_address, 0, 0)

    def release(self) -> bool:
        """Never frees: the singleton's buffers live for the process."""
        return True

    def stats(self) -> dict[str, int]:
        """Buffers torch allocated and those waiting."""
        return {"buffers": int(self._p._cupti_monitor_allocated_buffers()),
                "queued": self.pending()}

    def index_records(self, next_record: int, address: int, valid_size: int,
                      kind: int) -> RecordIndex | None:
        """No walk of its own: the shim's is used when it can be loaded (see ``decode``)."""
        return None


_STAT_NAMES = ("buffers", "free", "at_cupti", "queued", "decoding", "requests", "refused",
               "completed", "foreign", "bad_returns", "buffer_bytes")


class ShimLibrary:
    """The shim's C functions (one library per process: the pool is a process singleton)."""

    _loaded: ClassVar[dict[str, ShimLibrary]] = {}

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        u64, vp = ctypes.c_uint64, ctypes.c_void_p
        signatures = {
            "argus_shim_abi": ([], ctypes.c_int),
            "argus_shim_configure": ([u64, u64], ctypes.c_int),
            "argus_shim_get_completed": ([ctypes.c_int64, ctypes.POINTER(vp),
                                          ctypes.POINTER(u64), ctypes.POINTER(u64),
                                          ctypes.POINTER(ctypes.c_uint32)], ctypes.c_int),
            "argus_shim_return_buffer": ([vp], ctypes.c_int),
            "argus_shim_stop": ([], None),
            "argus_shim_release": ([], ctypes.c_int),
            "argus_shim_stats": ([ctypes.POINTER(u64)], ctypes.c_int),
            "argus_shim_index_records": ([vp, vp, u64, ctypes.c_uint32, vp, vp, ctypes.c_int64,
                                          vp], ctypes.c_int64),
        }
        for name, (argtypes, restype) in signatures.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, restype
        abi = lib.argus_shim_abi()
        if abi != ABI:
            raise ShimUnavailableError(f"{lib._name} has shim ABI {abi}, this Argus needs {ABI}")

    @classmethod
    def load(cls, env: Mapping[str, str]) -> ShimLibrary:
        """Locate (or build) and load the shim (once per path); raises
        ShimUnavailableError."""
        try:
            return open_library(SOURCE, cls._open, env)
        except OSError as exc:
            raise ShimUnavailableError(f"cannot load the CUPTI shim: {exc}") from None

    @classmethod
    def _open(cls, path: Path) -> ShimLibrary:
        shim = cls._loaded.get(str(path))
        if shim is None:
            shim = cls._loaded[str(path)] = cls(ctypes.CDLL(str(path)))
        return shim

    def index_records(self, next_record: int, address: int, valid_size: int,
                      kind: int) -> RecordIndex:
        """Walk a buffer with CUPTI's cuptiActivityGetNextRecord, in C."""
        capacity = valid_size // 64 + 1  # no kernel record is smaller than 64 bytes
        offsets = np.empty(capacity, dtype=np.int64)
        sizes = np.empty(capacity, dtype=np.int64)
        kinds = np.zeros(_KIND_SLOTS, dtype=np.int64)
        found = self.lib.argus_shim_index_records(
            next_record, address, valid_size, kind, offsets.ctypes.data, sizes.ctypes.data,
            capacity, kinds.ctypes.data)
        if found < 0:
            from argus_exporters.kernels.cupti import CuptiCallError

            raise CuptiCallError(int(-found), "cuptiActivityGetNextRecord (shim walk)")
        counts = {int(k): int(n) for k, n in enumerate(kinds.tolist()) if n}
        return RecordIndex(offsets[:found].copy(), sizes[:found].copy(), counts)


class ShimPlumbing:
    """The Argus C shim: fixed pool, completed queue, callbacks in C."""

    name = "argus shim"

    def __init__(self, shim: ShimLibrary):
        self.shim = shim
        self._lib = shim.lib

    def callback_addresses(self) -> tuple[int, int]:
        """The shim's request/complete function addresses."""
        return (ctypes.cast(self._lib.argus_shim_buffer_requested, ctypes.c_void_p).value,
                ctypes.cast(self._lib.argus_shim_buffer_completed, ctypes.c_void_p).value)

    def configure(self, buffers: int, buffer_bytes: int) -> None:
        """Allocate the fixed pool (8-byte multiple sizes)."""
        size = max(64, int(buffer_bytes) // 8 * 8)
        status = self._lib.argus_shim_configure(int(buffers), size)
        if status == -2:
            raise ProbeUnavailableError(
                "unavailable", "CUPTI still holds buffers of an earlier kernel probe")
        if status != 0:
            raise ProbeUnavailableError(
                "unavailable", f"cannot allocate {buffers} x {size} B CUPTI buffers")

    def get_completed(self, timeout_s: float) -> Completed | Stopped | None:
        """Waits up to ``timeout_s`` (GIL released)."""
        address, valid = ctypes.c_void_p(), ctypes.c_uint64()
        context, stream = ctypes.c_uint64(), ctypes.c_uint32()
        status = self._lib.argus_shim_get_completed(
            int(timeout_s * 1000), ctypes.byref(address), ctypes.byref(valid),
            ctypes.byref(context), ctypes.byref(stream))
        if status < 0:
            return STOPPED
        if status == 0:
            return None
        return Completed(address.value or 0, valid.value, context.value, stream.value)

    def return_buffer(self, address: int) -> None:
        """Back to the free stack."""
        self._lib.argus_shim_return_buffer(address)

    def pending(self) -> int:
        """Buffers in the completed queue."""
        return self.stats()["queued"]

    def stop(self) -> None:
        """Wake the decode thread; it ends once the queue is drained."""
        self._lib.argus_shim_stop()

    def release(self) -> bool:
        """Free the pool unless CUPTI still holds a buffer."""
        return self._lib.argus_shim_release() == 0

    def stats(self) -> dict[str, int]:
        """The shim's counters (pool states, requests, refusals, foreign buffers)."""
        out = (ctypes.c_uint64 * len(_STAT_NAMES))()
        self._lib.argus_shim_stats(out)
        return dict(zip(_STAT_NAMES, (int(v) for v in out), strict=True))

    def index_records(self, next_record: int, address: int, valid_size: int,
                      kind: int) -> RecordIndex | None:
        """The C walk."""
        return self.shim.index_records(next_record, address, valid_size, kind)


def select_plumbing(mode: str, env: Mapping[str, str]) -> CallbackPlumbing:
    """torch's callbacks where torch has them (``auto``/``torch``), else the shim (``auto``/
    ``shim``); raises ProbeUnavailableError naming why neither can run."""
    if mode not in MODES:
        raise ProbeUnavailableError("unavailable", f"unknown kernel callbacks {mode!r} "
                                                   f"(one of {', '.join(MODES)})")
    why_not_torch = "not asked for"
    if mode in ("auto", "torch"):
        torch_plumbing = TorchPlumbing.available()
        if isinstance(torch_plumbing, TorchPlumbing):
            return torch_plumbing
        why_not_torch = torch_plumbing
        if mode == "torch":
            raise ProbeUnavailableError("unavailable", f"no GIL-free CUPTI callbacks: "
                                                       f"{why_not_torch}")
    try:
        return ShimPlumbing(ShimLibrary.load(env))
    except ShimUnavailableError as exc:
        raise ProbeUnavailableError(
            "unavailable", f"no GIL-free CUPTI callbacks (Python callbacks could deadlock "
                           f"training): {why_not_torch}; {exc}") from None
