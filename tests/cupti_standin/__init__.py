"""The C stand-in for libcupti (``libcupti_standin.c``), built with gcc by the tests.

``Standin`` drives it: the kernel record layout comes from cupti-python's dtype, so the records
it writes are the ones the probe must decode; ``launch`` enters it the way a training thread
enters CUDA (through ``ctypes.PyDLL``, holding the GIL), or with the GIL released.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("libcupti_standin.c")
STATS = ("requests", "refused", "completed", "kernels", "foreign", "incomplete", "launches",
         "dropped", "held")
RUNTIME_KIND = 5  # cupti.cupti.ActivityKind.RUNTIME


def build(out_dir: Path) -> Path:
    """Compile the stand-in into ``out_dir``; raises RuntimeError without gcc."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler for the libcupti stand-in")
    target = Path(out_dir) / "libcupti_standin.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(target),
                    str(SOURCE)], check=True, capture_output=True)
    return target


class Standin:
    """One loaded stand-in (a process-wide singleton, like libcupti)."""

    def __init__(self, path: Path, kernel_dtype: np.dtype, other_dtype: np.dtype):
        self.path = str(path)
        self.lib = ctypes.CDLL(self.path)  # calls release the GIL
        self.holding_gil = ctypes.PyDLL(self.path)  # calls keep it: a training thread in CUDA
        u64 = ctypes.c_uint64
        for lib in (self.lib, self.holding_gil):
            lib.standin_launch.argtypes = [ctypes.c_uint32, ctypes.c_uint32, u64]
            lib.standin_launch.restype = ctypes.c_int
        self.lib.standin_configure.argtypes = [u64] * 6 + [ctypes.c_uint32, u64]
        self.lib.standin_set_timestamp_offset.argtypes = [ctypes.c_int64]
        self.lib.standin_rename.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
        self.lib.standin_name.argtypes = [ctypes.c_uint32]
        self.lib.standin_name.restype = ctypes.c_void_p
        self.lib.standin_stats.argtypes = [ctypes.POINTER(u64)]
        fields = kernel_dtype.fields
        self.lib.standin_configure(kernel_dtype.itemsize, *(fields[f][1] for f in (
            "kind", "start", "end", "stream_id", "name")), RUNTIME_KIND, other_dtype.itemsize)

    def launch(self, kernels: int, foreign: int = 0, duration_ns: int = 1_000, *,
               keep_gil: bool = True) -> None:
        """Launch ``kernels`` kernels (and ``foreign`` records of another kind)."""
        lib = self.holding_gil if keep_gil else self.lib
        lib.standin_launch(kernels, foreign, duration_ns)

    def stats(self) -> dict[str, int]:
        """The stand-in's counters (see ``standin_stats``)."""
        out = (ctypes.c_uint64 * len(STATS))()
        self.lib.standin_stats(out)
        return dict(zip(STATS, (int(v) for v in out), strict=True))

    def name_pointer(self, index: int) -> int:
        """Address of kernel name ``index``."""
        return int(self.lib.standin_name(index))

    def rename(self, index: int, text: str) -> None:
        """Give name ``index`` new text at the same address (a module unload and reuse)."""
        self.lib.standin_rename(index, text.encode())

    def set_status(self, register: int = 0, enable: int = 0, flush: int = 0) -> None:
        """CUPTI results the next register/enable/flush calls return."""
        self.lib.standin_set_status(register, enable, flush)

    def set_timestamp_offset(self, offset_ns: int) -> None:
        """Make cuptiGetTimestamp run ``offset_ns`` behind CLOCK_REALTIME."""
        self.lib.standin_set_timestamp_offset(offset_ns)

    def reset(self) -> None:
        """Forget callbacks, buffers and counters (flush first)."""
        self.lib.standin_reset()


_BUILT: dict[str, Path] = {}


def build_once(out_dir: Path) -> Path:
    """``build`` once per test process (later calls return the first library)."""
    if "path" not in _BUILT:
        _BUILT["path"] = build(out_dir)
    return _BUILT["path"]
