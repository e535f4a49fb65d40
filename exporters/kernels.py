"""The CUPTI kernel probe: GPU kernel executions as columnar ``kernels`` records.

How it works (DESIGN.md, "Conventions: CUPTI"):

- **Control** through cupti-python (``cupti.cupti.activity_enable/disable``), one traced step in
  ``settings.kernel_duty`` (CONCURRENT_KERNEL on for that step, off otherwise; with a duty of 1
  it is switched on once and left on).
- **Raw buffers**: the buffer callbacks are registered with libcupti directly through ctypes
  (``cuptiActivityRegisterCallbacks`` of the libcupti that cupti-python has loaded), so records
  never become one Python object each. CUPTI gets its buffers from a pool allocated at start
  (``kernel_buffers`` x ``kernel_buffer_bytes``, 8-byte aligned). The completed-callback only
  puts ``(address, valid_size)`` on a bounded queue; a daemon thread decodes each buffer in bulk
  with numpy and the cupti-python record dtype (``activity_kernel*_dtype``), emits one
  ``kernels`` record per buffer and gives the buffer back to the pool. The same thread calls
  ``cuptiActivityFlushAll`` every ``kernel_flush_s`` so buffers complete while training runs.
  The flush goes through ctypes, which releases the GIL: CUPTI may call our (GIL-taking)
  callbacks from its own thread while flushing.
- **Drops are counted, never waited for** (``Health.drop``): ``kernel_buffer_pool_empty`` (one
  per buffer request refused: CUPTI then drops records itself), ``kernel_queue_full``,
  ``kernel_record_layout_unknown``, ``kernel_incomplete_record``, ``kernel_decode_error``,
  ``kernel_emit_error`` (records, estimated from the buffer size where not decoded).

Kernel names are C string pointers in the records. ``NameTable`` reads a pointer's string once
(``ctypes.string_at``) and keeps pointer -> id; two pointers to the same text share one id, so a
batch's ``names`` never repeats a string. Each record carries only the names it uses. The table
holds at most 65,536 pointers, then starts over (a job compiling new kernels forever).

Which processes trace (``training_process``): DataLoader workers never; otherwise only a
training rank (RANK or LOCAL_RANK in the environment, or ``settings.extra["training_rank"]``).
A process whose parent is itself a training rank (a Python process with RANK/LOCAL_RANK that is
not a launcher such as torchrun) is a helper: an inductor compile worker, a DataLoader worker,
any subprocess. Where the parent cannot be read, a ``multiprocessing`` child outside torchrun is
taken for a helper. ``settings.extra["training_rank"] = True/False`` overrides the rule.

When another CUPTI client holds CUPTI (nsys/ncu injected through ``CUDA_INJECTION64_PATH``,
``torch.profiler`` recording, or CUPTI answering MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, HARDWARE_BUSY
or OLD_PROFILER_API_INITIALIZED) the probe reports ``busy`` once and stays out of the way for the
rest of the process: after torch.profiler (kineto) has registered its own buffer callbacks ours
are gone, and re-arming is not attempted. Buffers CUPTI still holds then complete to kineto,
which ignores buffers it did not allocate ("bufferCompleted called with unknown buffer"); our
pool memory stays allocated for the life of the process in case CUPTI still writes to it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import queue
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.records import kernels_record

logger = logging.getLogger("argus_exporters")

PROBE = "kernels"
CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10  # cupti.cupti.ActivityKind.CONCURRENT_KERNEL
CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1  # cupti.cupti.ActivityFlag.FLUSH_FORCED
CUPTI_SUCCESS = 0
CUPTI_ERROR_MAX_LIMIT_REACHED = 12  # cuptiActivityGetNextRecord: no more records
# CUPTI results that mean "someone else holds CUPTI" (cupti.cupti.Result values).
BUSY_STATUSES = {
    26: "ERROR_HARDWARE_BUSY",
    36: "ERROR_OLD_PROFILER_API_INITIALIZED",
    39: "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
}
UNKNOWN_NAME = "<unknown>"  # a NULL or empty name pointer (the schema wants non-empty names)
RECORD_FIELDS = ("kind", "start", "end", "stream_id", "name")
_KERNEL_DTYPE = re.compile(r"^activity_kernel(\d+)_dtype$")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch",
              "torch/distributed/run.py", "torch/distributed/launch.py", "deepspeed",
              "accelerate")
_ALIGN = 8


# --------------------------------------------------------------------------------------------
# Pure decoding (no CUPTI, no GPU): everything below up to KernelProbe is testable on a CPU.
# --------------------------------------------------------------------------------------------

class UnknownRecordLayoutError(ValueError):
    """A buffer that no known kernel record dtype tiles with CONCURRENT_KERNEL records only."""


def kernel_record_dtypes(module: Any = None) -> list[np.dtype]:
    """cupti-python's kernel record dtypes (``activity_kernel<N>_dtype``), newest first.

    ``module`` is ``cupti.cupti`` (imported here when None); [] without cupti-python.
    """
    if module is None:
        try:
            from cupti import cupti as module
        except Exception:  # not installed, or broken: the probe reports it
            return []
    found = []
    for attr in dir(module):
        match = _KERNEL_DTYPE.match(attr)
        if match is None:
            continue
        dtype = np.dtype(getattr(module, attr))
        if dtype.names is not None and all(f in dtype.names for f in RECORD_FIELDS):
            found.append((int(match.group(1)), dtype))
    return [dtype for _, dtype in sorted(found, key=lambda item: -item[0])]


def _nbytes(buf: Any) -> int:
    return memoryview(buf).nbytes


def pick_record_dtype(buf: Any, valid_size: int,
                      candidates: Sequence[np.dtype]) -> np.dtype | None:
    """The first candidate whose itemsize tiles ``valid_size`` and under which every record's
    ``kind`` is CONCURRENT_KERNEL; None if none fits. Pass candidates newest first.

    CUPTI writes records in the struct version of the running library; a wrong guess would
    read garbage, so the kind of every record is checked (a strided view, no copy).
    """
    if valid_size <= 0 or valid_size > _nbytes(buf):
        return None
    for dtype in candidates:
        size = dtype.itemsize
        if size == 0 or valid_size % size:
            continue
        kinds = np.frombuffer(buf, dtype=dtype, count=valid_size // size)["kind"]
        if bool(np.all(kinds == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)):
            return dtype
    return None


class NameTable:
    """Kernel names interned by pointer: a string is read once per pointer value.

    The same text behind two pointers gets one id. Only new pointers cost Python work; known
    ones are dictionary hits per *distinct* pointer of a buffer, never per record. Memory is
    bounded: a job that keeps compiling new kernels (Triton autotuning, torch.compile
    recompiles) brings new pointers forever, so past ``max_pointers`` the table starts over
    (``resets`` counts it). Ids are stable within one ``ids`` call, which is all a buffer
    needs: every record carries the names it uses.
    """

    def __init__(self, max_pointers: int = 1 << 16) -> None:
        self.names: list[str] = []
        self.max_pointers = max_pointers
        self.resets = 0
        self._by_pointer: dict[int, int] = {}
        self._by_text: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.names)

    def ids(self, pointers: np.ndarray, read_name: Callable[[int], str]) -> np.ndarray:
        """Ids (int64) of the given distinct pointers, reading the strings of new ones."""
        if len(self._by_pointer) >= self.max_pointers:
            self.names, self._by_pointer, self._by_text = [], {}, {}
            self.resets += 1
        out = np.empty(len(pointers), dtype=np.int64)
        by_pointer = self._by_pointer
        for i, pointer in enumerate(pointers.tolist()):
            name_id = by_pointer.get(pointer)
            if name_id is None:
                name_id = by_pointer[pointer] = self._intern(pointer, read_name)
            out[i] = name_id
        return out

    def _intern(self, pointer: int, read_name: Callable[[int], str]) -> int:
        text = ""
        if pointer:
            try:
                text = read_name(pointer)
            except Exception:  # a pointer we cannot read is a name we do not know
                text = ""
        text = text or UNKNOWN_NAME
        name_id = self._by_text.get(text)
        if name_id is None:
            name_id = self._by_text[text] = len(self.names)
            self.names.append(text)
        return name_id


@dataclass(frozen=True)
class KernelColumns:
    """One decoded buffer: the columns of a ``kernels`` record (``name`` indexes ``names``)."""

    names: list[str]
    name: np.ndarray  # int32
    stream: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    skipped: int  # records without usable timestamps (start 0 or end < start)
    record_dtype: np.dtype | None  # the dtype that tiled the buffer (None when empty)

    @property
    def count(self) -> int:
        """Number of kernel executions decoded."""
        return len(self.start_ns)


def _empty_columns(dtype: np.dtype | None) -> KernelColumns:
    empty = np.empty(0, dtype=np.int64)
    return KernelColumns([], np.empty(0, dtype=np.int32), empty, empty.copy(), empty.copy(), 0,
                         dtype)


def decode_kernel_buffer(buf: Any, valid_size: int, names: NameTable,
                         read_name: Callable[[int], str], *, dtype: np.dtype | None = None,
                         candidates: Sequence[np.dtype] | None = None) -> KernelColumns:
    """Decode a completed CUPTI activity buffer into ``kernels`` columns, all in numpy.

    ``dtype`` (the one that fitted last time) is tried first, then ``candidates`` (by default
    cupti-python's kernel dtypes, newest first). Raises UnknownRecordLayoutError when none fits.
    The columns are copies: the buffer can go back to CUPTI as soon as this returns.
    """
    if valid_size <= 0:
        return _empty_columns(dtype)
    chosen = pick_record_dtype(buf, valid_size, [dtype]) if dtype is not None else None
    if chosen is None:
        pool = kernel_record_dtypes() if candidates is None else candidates
        chosen = pick_record_dtype(buf, valid_size, pool)
    if chosen is None:
        raise UnknownRecordLayoutError(f"{valid_size} valid bytes match no kernel record dtype "
                                       "with only CONCURRENT_KERNEL records")
    records = np.frombuffer(buf, dtype=chosen, count=valid_size // chosen.itemsize)
    start = records["start"].astype(np.int64)  # uint64 ns; >= 2**63 wraps negative: rejected
    end = records["end"].astype(np.int64)
    pointers = records["name"]
    stream = records["stream_id"]
    usable = (start > 0) & (end >= start)
    skipped = len(usable) - int(np.count_nonzero(usable))
    if skipped:
        start, end, pointers, stream = start[usable], end[usable], pointers[usable], stream[usable]
    distinct, per_record = np.unique(pointers, return_inverse=True)
    name_ids = names.ids(distinct, read_name)
    used, local_of_distinct = np.unique(name_ids, return_inverse=True)
    table = names.names
    return KernelColumns(
        names=[table[i] for i in used.tolist()],
        name=local_of_distinct.reshape(-1)[per_record.reshape(-1)].astype(np.int32),
        stream=stream.astype(np.int64),
        start_ns=start,
        dur_ns=end - start,
        skipped=skipped,
        record_dtype=chosen,
    )


def read_c_string(pointer: int) -> str:
    """The NUL-terminated string at ``pointer`` (a CUPTI kernel name), UTF-8 decoded."""
    return ctypes.string_at(pointer).decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------
# Which processes trace
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParentInfo:
    """What we can see of the parent process: its initial environment keys and command line."""

    env_keys: frozenset[str]
    cmdline: tuple[str, ...]


def _parent_info() -> ParentInfo | None:
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/environ", "rb") as f:
            environ = f.read()
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    keys = frozenset(item.split(b"=", 1)[0].decode("utf-8", "replace")
                     for item in environ.split(b"\0") if item)
    argv = tuple(a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a)
    return ParentInfo(keys, argv)


def training_process(env: Mapping[str, str], *, forced: bool | None = None,
                     worker_info: object = None, parent: ParentInfo | None = None,
                     mp_child: bool = False, argv0: str = "") -> tuple[bool, str]:
    """Whether this process is a training rank that should trace kernels, and why (pure).

    See the module docstring for the rule; ``forced`` is ``settings.extra["training_rank"]``.
    """
    if worker_info is not None:
        return False, "DataLoader worker process"
    if forced is not None:
        return forced, "settings.extra['training_rank'] = " + str(forced)
    if "RANK" not in env and "LOCAL_RANK" not in env:
        return False, "not a training rank (no RANK or LOCAL_RANK in the environment)"
    if "compile_worker" in argv0 or "_inductor" in argv0:
        return False, "inductor compile worker"
    if parent is not None:
        command = " ".join(parent.cmdline)
        if any(launcher in command for launcher in _LAUNCHERS):
            return True, "training rank (child of a launcher)"
        program = os.path.basename(parent.cmdline[0]) if parent.cmdline else ""
        parent_is_rank = "RANK" in parent.env_keys or "LOCAL_RANK" in parent.env_keys
        if parent_is_rank and program.startswith("python"):
            return False, "child of a training rank (compile worker, DataLoader worker or helper)"
        return True, "training rank"
    if mp_child and "TORCHELASTIC_RUN_ID" not in env:
        return False, "multiprocessing child outside torchrun (compile or DataLoader worker)"
    return True, "training rank"


def _dataloader_worker_info() -> object:
    torch = sys.modules.get("torch")
    if torch is None or "torch.utils.data" not in sys.modules:
        return None
    try:
        return torch.utils.data.get_worker_info()
    except Exception:
        return None


def _profiler_check() -> Callable[[], bool] | None:
    """torch's "is the autograd/kineto profiler on" function, if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch._C._autograd._profiler_enabled
    except AttributeError:
        return None


def foreign_profiler(env: Mapping[str, str]) -> str | None:
    """Why another CUPTI client holds CUPTI right now (nsys/ncu injected, torch.profiler on)."""
    injected = env.get("CUDA_INJECTION64_PATH")
    if injected:
        return f"another CUPTI tool is injected (CUDA_INJECTION64_PATH={injected}: nsys/ncu)"
    check = _profiler_check()
    if check is not None:
        try:
            if check():
                return "torch.profiler is recording (kineto owns CUPTI's activity buffers)"
        except Exception:
            return None
    return None


def state_for_status(status: int) -> str:
    """``busy`` for the CUPTI results that mean another client holds CUPTI, else unavailable."""
    return "busy" if status in BUSY_STATUSES else "unavailable"


# --------------------------------------------------------------------------------------------
# CUPTI control (GPU-only paths; tests replace it with a fake of the same shape)
# --------------------------------------------------------------------------------------------

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


class CuptiControl(Protocol):
    """What the probe needs from CUPTI; ``CuptiBackend`` is the real one."""

    def record_dtypes(self) -> list[np.dtype]:
        """Candidate kernel record dtypes, newest first."""
        ...

    def register(self, request: Callable[[], tuple[int, int]],
                 complete: Callable[[int, int], None]) -> None:
        """Install the buffer callbacks; raises CuptiCallError."""
        ...

    def enable(self) -> None:
        """Start recording CONCURRENT_KERNEL; raises CuptiCallError."""
        ...

    def disable(self) -> None:
        """Stop recording CONCURRENT_KERNEL; raises CuptiCallError."""
        ...

    def flush(self, forced: bool) -> None:
        """Hand back completed buffers through the completed-callback; raises CuptiCallError."""
        ...

    def read_name(self, pointer: int) -> str:
        """The kernel name behind a record's name pointer."""
        ...

    def describe(self) -> str:
        """A short line for the probe state: CUPTI version and library."""
        ...


_REQUEST_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_COMPLETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_size_t)
# CUPTI may call the callbacks until the process ends: they (and the buffers CUPTI may still
# hold) are kept alive for the life of the process.
_KEEPALIVE: list[Any] = []


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


def open_libcupti() -> ctypes.CDLL:
    """The libcupti that cupti-python loaded (call after a cupti-python call succeeded).

    One libcupti mapped: that one. Several: the one cuda.pathfinder resolves (cupti-python
    loads through it). None visible (no /proc): cuda.pathfinder, then the linker's search.
    Opening an already-loaded path returns the same handle: one CUPTI state, not two.
    """
    mapped = _mapped_libcupti()
    if len(mapped) == 1:
        return ctypes.CDLL(mapped[0])
    resolved = None
    with contextlib.suppress(Exception):
        from cuda.pathfinder import load_nvidia_dynamic_lib
        resolved = os.path.realpath(load_nvidia_dynamic_lib("cupti").abs_path)
    if mapped:
        if resolved in mapped:
            return ctypes.CDLL(resolved)
        raise ProbeUnavailableError(
            "unavailable", f"several libcupti are loaded ({', '.join(mapped)}) and none is the "
                           "one cupti-python uses")
    path = resolved or ctypes.util.find_library("cupti")
    if not path:
        raise ProbeUnavailableError("unavailable", "libcupti not found")
    return ctypes.CDLL(path)


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


class CuptiBackend:
    """cupti-python for control, ctypes on the same libcupti for the buffer callbacks/flush."""

    def __init__(self, cupti: Any, lib: ctypes.CDLL):
        self.cupti = cupti
        self.lib = lib
        lib.cuptiActivityRegisterCallbacks.argtypes = [_REQUEST_FN, _COMPLETE_FN]
        lib.cuptiActivityRegisterCallbacks.restype = ctypes.c_int
        lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        lib.cuptiActivityFlushAll.restype = ctypes.c_int
        self._kind = int(cupti.ActivityKind.CONCURRENT_KERNEL)

    @classmethod
    def load(cls) -> CuptiBackend:
        """Import cupti-python, check for a GPU, initialise CUPTI; raises ProbeUnavailableError."""
        try:
            from cupti import cupti
        except Exception as exc:
            raise ProbeUnavailableError("unavailable",
                                        f"cupti-python is not installed ({exc})") from None
        problem = _gpu_problem()
        if problem:
            raise ProbeUnavailableError("unavailable", problem)
        try:
            cupti.get_timestamp()  # loads libcupti in cupti-python, checks the driver
        except cupti.cuptiError as exc:
            raise ProbeUnavailableError(state_for_status(exc.status), f"CUPTI: {exc}") from None
        except Exception as exc:
            raise ProbeUnavailableError("unavailable", f"CUPTI cannot start: {exc}") from None
        try:
            lib = open_libcupti()
            return cls(cupti, lib)
        except ProbeUnavailableError:
            raise
        except Exception as exc:
            raise ProbeUnavailableError("unavailable", f"libcupti via ctypes: {exc}") from None

    def record_dtypes(self) -> list[np.dtype]:
        """cupti-python's kernel record dtypes, newest first."""
        return kernel_record_dtypes(self.cupti)

    def register(self, request: Callable[[], tuple[int, int]],
                 complete: Callable[[int, int], None]) -> None:
        """Register ctypes trampolines to ``request``/``complete`` with libcupti."""

        def on_request(buffer, size, max_records):
            try:
                address, nbytes = request()
            except BaseException:
                address, nbytes = 0, 0
            buffer[0] = address or None
            size[0] = nbytes if address else 0
            max_records[0] = 0

        def on_complete(context, stream_id, buffer, size, valid_size):
            with contextlib.suppress(BaseException):
                complete(buffer or 0, valid_size)

        callbacks = (_REQUEST_FN(on_request), _COMPLETE_FN(on_complete))
        _KEEPALIVE.append(callbacks)
        status = self.lib.cuptiActivityRegisterCallbacks(*callbacks)
        if status != CUPTI_SUCCESS:
            raise CuptiCallError(status, "cuptiActivityRegisterCallbacks")

    def _call(self, fn: Callable[[int], Any], where: str) -> None:
        try:
            fn(self._kind)
        except self.cupti.cuptiError as exc:
            raise CuptiCallError(exc.status, where, str(exc)) from None
        except Exception as exc:
            raise CuptiCallError(-1, where, str(exc)) from None

    def enable(self) -> None:
        """cupti.activity_enable(CONCURRENT_KERNEL)."""
        self._call(self.cupti.activity_enable, "cuptiActivityEnable")

    def disable(self) -> None:
        """cupti.activity_disable(CONCURRENT_KERNEL)."""
        self._call(self.cupti.activity_disable, "cuptiActivityDisable")

    def flush(self, forced: bool) -> None:
        """cuptiActivityFlushAll through ctypes (GIL released while CUPTI calls back)."""
        status = self.lib.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED if forced else 0)
        if status != CUPTI_SUCCESS:
            raise CuptiCallError(status, "cuptiActivityFlushAll")

    def read_name(self, pointer: int) -> str:
        """The C string at ``pointer``."""
        return read_c_string(pointer)

    def describe(self) -> str:
        """CUPTI API version and the library path."""
        version = ctypes.c_uint32(0)
        with contextlib.suppress(Exception):
            self.lib.cuptiGetVersion(ctypes.byref(version))
        return f"CUPTI API {version.value} ({self.lib._name})"


# --------------------------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------------------------

@dataclass
class KernelProbeStats:
    """Counters of the probe's own work (read by benchmarks and the GPU check)."""

    buffers: int = 0
    records: int = 0
    decode_s: float = 0.0  # wall time in decode_kernel_buffer
    toggles: int = 0  # activity enable/disable calls
    toggle_s_max: float = 0.0
    flushes: int = 0


_WAKE = None  # queue item that only wakes the decode thread


class KernelProbe:
    """GPU kernel executions from CUPTI, one traced step in ``settings.kernel_duty``.

    ``start()`` never raises; every other method is a no-op unless ``start()`` returned True.
    ``backend``, ``env`` and ``queue_size`` are for tests and the GPU check.
    """

    def __init__(self, settings: Settings, identity: RankIdentity,
                 emit: Callable[[dict], None], health: Health, *,
                 backend: CuptiControl | None = None, env: Mapping[str, str] | None = None,
                 queue_size: int | None = None):
        self._settings = settings
        self._identity = identity
        self._emit = emit
        self._health = health
        self._backend = backend
        self._env = os.environ if env is None else env
        self._duty = max(1, int(settings.kernel_duty))
        self._buffer_bytes = int(settings.kernel_buffer_bytes)
        depth = queue_size if queue_size is not None else settings.kernel_buffers
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._pool: deque[int] = deque()
        self._buffers: dict[int, np.ndarray] = {}
        self._names = NameTable()
        self._dtype: np.dtype | None = None
        self._candidates: list[np.dtype] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started: bool | None = None
        self._active = False  # callbacks registered, hooks may touch CUPTI
        self._tracing = False  # CONCURRENT_KERNEL enabled now
        self._ever_traced = False
        self._closed = False
        self._profiler_enabled: Callable[[], bool] | None = None
        self._layout_reported = False
        self.state: tuple[str, str] | None = None
        self.stats = KernelProbeStats()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Arm the probe in a training rank; False (state reported once) when it cannot run."""
        if self._started is not None:
            return self._started
        self._started = False
        try:
            self._started = self._start()
        except Exception as exc:  # never into training
            self._report("unavailable", f"start failed: {exc!r}")
            self._release_pool()
        return self._started

    def _start(self) -> bool:
        settings = self._settings
        if not settings.kernels:
            self._report("off", "ARGUS_KERNELS is not set")
            return False
        forced = settings.extra.get("training_rank")
        ok, why = training_process(
            self._env, forced=None if forced is None else bool(forced),
            worker_info=_dataloader_worker_info(), parent=_parent_info(),
            mp_child=multiprocessing.parent_process() is not None,
            argv0=sys.argv[0] if sys.argv else "")
        if not ok:
            self._report("skipped", why)
            return False
        busy = foreign_profiler(self._env)
        if busy:
            self._report("busy", busy)
            return False
        try:
            backend = self._backend or CuptiBackend.load()
        except ProbeUnavailableError as exc:
            self._report(exc.state, exc.reason)
            return False
        self._backend = backend
        self._candidates = backend.record_dtypes()
        if not self._candidates:
            self._report("unavailable", "cupti-python ships no activity_kernel*_dtype")
            return False
        self._allocate_pool()
        try:
            backend.register(self._request_buffer, self._buffer_completed)
        except CuptiCallError as exc:
            self._release_pool()
            self._report(state_for_status(exc.status), str(exc))
            return False
        self._profiler_enabled = _profiler_check()
        self._thread = threading.Thread(target=self._run, name="argus-kernels", daemon=True)
        self._thread.start()
        self._active = True
        atexit.register(self._atexit)
        self._report("on", f"{backend.describe()}; 1 step in {self._duty}; "
                           f"{len(self._buffers)} x {self._buffer_bytes} B buffers")
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop tracing, flush CUPTI, decode what is left and stop the decode thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            was_active, self._active = self._active, False
            if was_active:
                if self._tracing:
                    self._tracing = False
                    with contextlib.suppress(Exception):
                        self._backend.disable()
                with contextlib.suppress(Exception):
                    self._backend.flush(True)
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)
        self._stop_thread(timeout)
        self._release_pool()

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown(timeout=2.0)

    # -- training-thread hooks -----------------------------------------------------------------

    def step_begin(self, step: int) -> None:
        """Enable CONCURRENT_KERNEL if ``step`` is a traced one (1 in ``kernel_duty``)."""
        if not self._active:
            return
        check = self._profiler_enabled
        if check is not None and check():
            self._go_inert("busy", "torch.profiler started recording: it owns CUPTI now")
            return
        if not self._tracing and step % self._duty == 0:
            self._set_tracing(True)

    def step_end(self, step: int) -> None:
        """Disable CONCURRENT_KERNEL after a traced step (kept on when every step is traced)."""
        if self._active and self._tracing and self._duty > 1:
            self._set_tracing(False)

    def pause(self) -> None:
        """Stop collecting until the next traced ``step_begin`` (e.g. around an eval loop)."""
        if self._active and self._tracing:
            self._set_tracing(False)

    def _set_tracing(self, on: bool) -> None:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        with self._lock:
            if not self._active or self._tracing == on:
                return
            try:
                if on:
                    self._backend.enable()
                else:
                    self._backend.disable()
            except CuptiCallError as exc:
                self._active = False
                self._tracing = False
                failure: CuptiCallError | None = exc
            else:
                self._tracing = on
                self._ever_traced = self._ever_traced or on
                failure = None
        if failure is not None:
            self._go_inert(state_for_status(failure.status), str(failure))
        wall = time.perf_counter() - wall0
        self.stats.toggles += 1
        self.stats.toggle_s_max = max(self.stats.toggle_s_max, wall)
        self._health.add_cpu(time.thread_time() - cpu0)

    def _go_inert(self, state: str, reason: str) -> None:
        """Stop touching CUPTI for the rest of the process (another client took it over)."""
        with self._lock:
            self._active = False
            self._tracing = False
        self._report(state, reason)
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_WAKE)

    # -- CUPTI callbacks (any thread; they must only move integers) ---------------------------

    def _request_buffer(self) -> tuple[int, int]:
        """A free pool buffer for CUPTI as (address, size); (0, 0) and a drop when none left."""
        try:
            address = self._pool.popleft()
        except IndexError:
            self._health.drop("kernel_buffer_pool_empty")
            return 0, 0
        return address, self._buffer_bytes

    def _buffer_completed(self, address: int, valid_size: int) -> None:
        """Queue a completed buffer for the decode thread (drop and recycle it when full)."""
        if address not in self._buffers:
            return  # not one of ours: never touch it
        if valid_size <= 0:
            self._pool.append(address)
            return
        try:
            self._queue.put_nowait((address, valid_size))
        except queue.Full:
            self._health.drop("kernel_queue_full", self._estimate(valid_size))
            self._pool.append(address)

    def _estimate(self, valid_size: int) -> int:
        dtype = self._dtype
        if dtype is None and self._candidates:
            dtype = self._candidates[0]
        return max(1, valid_size // dtype.itemsize) if dtype is not None else 1

    # -- decode thread -------------------------------------------------------------------------

    def _run(self) -> None:
        flush_s = float(self._settings.kernel_flush_s)
        next_flush = time.monotonic() + flush_s
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = _WAKE
            if item is not _WAKE:
                self._decode_buffer(*item)
            if not self._stop.is_set() and time.monotonic() >= next_flush:
                self._periodic_flush()
                next_flush = time.monotonic() + flush_s
        while True:  # what is queued when the stop comes, or raced it
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _WAKE:
                self._decode_buffer(*item)

    def _periodic_flush(self) -> None:
        if not (self._active and self._ever_traced):
            return
        try:
            self._backend.flush(True)
            self.stats.flushes += 1
        except CuptiCallError as exc:
            self._go_inert(state_for_status(exc.status), str(exc))

    def _decode_buffer(self, address: int, valid_size: int) -> None:
        """Decode one completed buffer, return it to the pool, emit one ``kernels`` record."""
        buf = self._buffers.get(address)
        if buf is None:
            return
        cpu0 = time.thread_time()
        wall0 = time.perf_counter()
        columns = None
        try:
            columns = decode_kernel_buffer(buf, valid_size, self._names, self._backend.read_name,
                                           dtype=self._dtype, candidates=self._candidates)
        except UnknownRecordLayoutError as exc:
            self._health.drop("kernel_record_layout_unknown", self._estimate(valid_size))
            if not self._layout_reported:
                self._layout_reported = True
                self._report("degraded", f"{exc}; is cupti-python built for this CUPTI?")
        except Exception:
            self._health.drop("kernel_decode_error", self._estimate(valid_size))
            logger.debug("argus: kernel buffer decode failed", exc_info=True)
        finally:
            self._pool.append(address)  # the columns are copies
        self.stats.decode_s += time.perf_counter() - wall0
        self.stats.buffers += 1
        if columns is not None:
            if columns.record_dtype is not None:
                self._dtype = columns.record_dtype
            if columns.skipped:
                self._health.drop("kernel_incomplete_record", columns.skipped)
            if columns.count:
                self.stats.records += columns.count
                record = kernels_record(self._identity, columns.names, columns.name,
                                        columns.stream, columns.start_ns, columns.dur_ns)
                try:
                    self._emit(record)
                except Exception:
                    self._health.drop("kernel_emit_error", columns.count)
        self._health.add_cpu(time.thread_time() - cpu0)

    def _stop_thread(self, timeout: float) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_WAKE)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- buffer pool ---------------------------------------------------------------------------

    def _allocate_pool(self) -> None:
        size = self._buffer_bytes
        for _ in range(max(1, int(self._settings.kernel_buffers))):
            raw = np.zeros(size + _ALIGN, dtype=np.uint8)
            offset = (-raw.ctypes.data) % _ALIGN
            view = raw[offset:offset + size]
            address = view.ctypes.data
            self._buffers[address] = view
            self._pool.append(address)

    def _release_pool(self) -> None:
        """Free the pool if every buffer is home; else keep it alive (CUPTI may still write)."""
        if not self._buffers:
            return
        if len(self._pool) != len(self._buffers):
            _KEEPALIVE.append(list(self._buffers.values()))
        self._buffers = {}
        self._pool.clear()

    # -- health ----------------------------------------------------------------------------

    def _report(self, state: str, reason: str) -> None:
        self.state = (state, reason)
        self._health.probe_state(PROBE, state, reason)
