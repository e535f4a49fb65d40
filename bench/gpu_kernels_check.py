"""GPU check of the CUPTI kernel probe (exporters/kernels.py): correctness and decode cost.

    python bench/gpu_kernels_check.py [--steps 30] [--only compare,overhead,duty,objects]

Needs a CUDA GPU, torch with CUDA, and cupti-python matching the CUPTI in use (on the H200
machine: carry the cupti-python==13.0.1 cp312 wheel and pip-install it first). Each part runs
in its own child process (CUPTI state is per process) on the same small workload: matmuls,
pointwise ops and a reduction on the default stream plus a matmul/softmax on a side stream,
``--inner`` times per step (~300 kernels per step by default), after a warm-up.

- ``compare``: the probe on (duty 1). Every completed buffer is also walked the CUPTI way,
  ``cuptiActivityGetNextRecord`` (ctypes, same libcupti) + cupti-python's per-record object
  (``ActivityKernel<N>.from_ptr``), before the probe decodes it with numpy; the emitted record
  is compared record for record (start, dur, stream, name): ``mismatches``. ``tiling_mismatches``
  counts records CUPTI did not place at i * itemsize. Then the captured raw records are tiled
  into one large buffer and the numpy decode, the from_ptr objects (creation + 4 reads; they
  are kept alive: their dealloc raises a KeyError in cupti-python's BufferManager for buffers it
  did not issue) and the GetNextRecord walk are timed per record on the same bytes. Also:
  whether ``cupti.subscribe`` succeeds here (does torch/kineto hold a CUPTI subscriber?).
- ``overhead``: median step time with the probe off, then on (duty 1), synchronised steps.
- ``duty``: duty 2; kernels must start inside the traced steps' windows; records per traced
  step versus ``compare``'s records per step; the enable/disable cost.
- ``objects``: cupti-python's own path (``activity_register_callbacks`` with Python callbacks,
  one object per record): time per record of the final forced flush (object creation + a
  trivial loop), and the kernel-name counts versus ``compare``.

Prints one JSON object; exits 2 with ``{"ok": false, "error": ...}`` where there is no GPU.
Runs from a plain checkout too (no ``pip install -e .``): ``argus_exporters`` is then loaded from
``exporters/``, and orjson, which the exporters' record encoder imports but this check never
uses, is stubbed if missing (reported as ``orjson_stubbed``).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

PARTS = ("compare", "overhead", "duty", "objects")
CHILD_TIMEOUT_S = 240
REPO = Path(__file__).resolve().parent.parent


def _ensure_imports() -> bool:
    """Make ``argus_exporters`` importable from a plain checkout; True if orjson was stubbed."""
    import types

    stubbed = False
    try:
        import orjson  # noqa: F401
    except ImportError:
        stub = types.ModuleType("orjson")
        stub.OPT_SERIALIZE_NUMPY, stub.OPT_APPEND_NEWLINE = 1 << 4, 1 << 10

        def dumps(*args: Any, **kwargs: Any) -> bytes:
            raise NotImplementedError("orjson is stubbed in gpu_kernels_check")

        stub.dumps = dumps
        sys.modules["orjson"] = stub
        stubbed = True
    try:
        import argus_exporters  # noqa: F401
    except ImportError:  # not installed, or its __init__ needs what is not here: a bare package
        for name in [m for m in sys.modules if m.split(".")[0] == "argus_exporters"]:
            del sys.modules[name]
        package = types.ModuleType("argus_exporters")
        package.__path__ = [str(REPO / "exporters")]
        sys.modules["argus_exporters"] = package
    return stubbed


ORJSON_STUBBED = _ensure_imports()


def _no_gpu_reason() -> str | None:
    """Why this machine cannot run the check (None when it can)."""
    try:
        import torch
    except Exception as exc:
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return (f"no GPU: torch {torch.__version__} reports torch.cuda.is_available() is False "
                f"(CUDA build: {torch.version.cuda})")
    try:
        from cupti import cupti  # noqa: F401
    except Exception as exc:
        return f"cupti-python is not importable ({exc}); pip-install the carried wheel"
    return None


# ---- the workload --------------------------------------------------------------------------------

def _make_workload(inner: int):
    import torch

    torch.manual_seed(0)
    x = torch.randn(512, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    side = torch.cuda.Stream()

    def step() -> None:
        for _ in range(inner):
            y = torch.relu(x @ w) * 0.5 + 1.0
            s = y.sum()
            with torch.cuda.stream(side):
                z = (x @ w.t()).softmax(-1)
            torch.cuda.current_stream().wait_stream(side)
            _ = s + z.mean()  # no host sync inside the step

    return step


def _settings(duty: int):
    from argus_exporters.config import Settings

    return Settings(enabled=True, kernels=True, kernel_duty=duty, kernel_flush_s=0.2,
                    kernel_buffer_bytes=8 << 20, kernel_buffers=8,
                    extra={"training_rank": True})


def _identity():
    from argus_exporters.identity import RankIdentity

    return RankIdentity(job="gpu-check", rank=0, world_size=1, local_rank=0, host="h",
                        coords={"dp": 0, "tp": 0, "pp": 0, "ep": 0})


def _kernel_class(cupti: Any, dtype: Any) -> Any:
    """cupti-python's ActivityKernel<N> class for the record dtype the probe picked."""
    import numpy as np

    for attr in dir(cupti):
        match = re.match(r"^activity_kernel(\d+)_dtype$", attr)
        if match and np.dtype(getattr(cupti, attr)) == dtype:
            return getattr(cupti, f"ActivityKernel{match.group(1)}")
    raise LookupError(f"no cupti-python class for {dtype}")


# cupti-python's record objects tell its BufferManager when they die; for records in buffers
# the BufferManager did not issue (ours), that raises and prints a KeyError per object. The
# objects made here are kept alive and the child leaves with os._exit, so none of them dies.
_KEEP: list[Any] = []


def _next_record_fn(lib: ctypes.CDLL):
    fn = lib.cuptiActivityGetNextRecord
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int
    return fn


def _walk(next_record, address: int, valid: int, cls: Any | None, kind: int):
    """CUPTI's own iteration; rows (offset, kind, start, end, stream, name) via objects."""
    from argus_exporters.kernels import CUPTI_ERROR_MAX_LIMIT_REACHED

    rows, record = [], ctypes.c_void_p(None)
    while True:
        status = next_record(address, valid, ctypes.byref(record))
        if status == CUPTI_ERROR_MAX_LIMIT_REACHED:
            return rows, None
        if status != 0:
            return rows, f"cuptiActivityGetNextRecord returned {status}"
        pointer = record.value
        rec_kind = ctypes.c_int32.from_address(pointer).value
        if rec_kind != kind or cls is None:
            rows.append((pointer - address, rec_kind, None, None, None, None))
            continue
        obj = cls.from_ptr(pointer, readonly=True)
        _KEEP.append(obj)
        rows.append((pointer - address, rec_kind, obj.start, obj.end, obj.stream_id, obj.name))


# ---- children ------------------------------------------------------------------------------------

def child_compare(steps: int, inner: int) -> dict:
    """Probe on, duty 1; reference walk on the same buffers; decode timings."""
    import torch
    from cupti import cupti

    from argus_exporters.health import Health
    from argus_exporters.kernels import CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as KIND
    from argus_exporters.kernels import KernelProbe, pick_record_dtype

    step = _make_workload(inner)
    for _ in range(3):
        step()
    torch.cuda.synchronize()

    subscribe = {"ok": None, "error": None}
    try:
        handle = cupti.subscribe(lambda *args: None, None)
        cupti.unsubscribe(handle)
        subscribe["ok"] = True
    except Exception as exc:
        subscribe.update(ok=False, error=str(exc))

    emitted: list[dict] = []
    check = {"buffers": 0, "ref_records": 0, "decoded": 0, "mismatches": 0,
             "tiling_mismatches": 0, "foreign_kinds": 0, "walk_errors": [], "walk_s": 0.0,
             "examples": []}
    raw_buffers: list[bytes] = []

    class CheckedProbe(KernelProbe):
        def _decode_buffer(self, address: int, valid_size: int) -> None:
            buf = self._buffers.get(address)
            if buf is None:
                return super()._decode_buffer(address, valid_size)
            raw_buffers.append(bytes(buf[:valid_size]))
            dtype = self._dtype
            if dtype is None:
                dtype = pick_record_dtype(buf, valid_size, self._candidates)
            cls = _kernel_class(cupti, dtype) if dtype is not None else None
            t0 = time.perf_counter()
            rows, error = _walk(_next_record_fn(self._backend.lib), address, valid_size, cls,
                                KIND)
            check["walk_s"] += time.perf_counter() - t0
            if error:
                check["walk_errors"].append(error)
            before = len(emitted)
            super()._decode_buffer(address, valid_size)
            check["buffers"] += 1
            itemsize = dtype.itemsize if dtype is not None else 0
            ref = []
            for i, (offset, kind, start, end, stream, name) in enumerate(rows):
                if offset != i * itemsize:
                    check["tiling_mismatches"] += 1
                if kind != KIND:
                    check["foreign_kinds"] += 1
                    continue
                if start and end >= start:
                    ref.append((start, end - start, stream, name or "<unknown>"))
            check["ref_records"] += len(ref)
            got = []
            if len(emitted) > before:
                rec = emitted[-1]
                got = list(zip(rec["start_ns"].tolist(), rec["dur_ns"].tolist(),
                               rec["stream"].tolist(), [rec["names"][i] for i in rec["name"]],
                               strict=True))
            check["decoded"] += len(got)
            bad = [(a, b) for a, b in zip(ref, got, strict=False) if a != b]
            check["mismatches"] += len(bad) + abs(len(ref) - len(got))
            if bad and len(check["examples"]) < 3:
                check["examples"].append({"reference": list(bad[0][0]), "probe": list(bad[0][1])})
            return None

    health = Health()
    probe = CheckedProbe(_settings(1), _identity(), emitted.append, health)
    if not probe.start():
        return {"started": False, "state": list(probe.state or ()), "subscribe": subscribe}
    t0 = time.perf_counter()
    for s in range(steps):
        probe.step_begin(s)
        step()
        probe.step_end(s)
    torch.cuda.synchronize()
    run_s = time.perf_counter() - t0
    probe.shutdown()

    names = Counter()
    for rec in emitted:
        for i in rec["name"].tolist():
            names[rec["names"][i]] += 1
    dtype = probe._dtype
    out = {
        "started": True, "state": list(probe.state or ()), "subscribe": subscribe,
        "record_dtype": repr(dtype.names[:3]) + f" itemsize {dtype.itemsize}" if dtype else None,
        "itemsize": dtype.itemsize if dtype else None,
        "kernel_class": _kernel_class(cupti, dtype).__name__ if dtype else None,
        "steps": steps, "run_s": run_s, "records": probe.stats.records,
        "records_per_step": probe.stats.records / steps,
        "emitted_records": len(emitted), "dropped": dict(health.dropped),
        "probe_decode_us_per_record": 1e6 * probe.stats.decode_s / max(1, probe.stats.records),
        "walk_objects_us_per_record_in_thread": 1e6 * check.pop("walk_s") / max(
            1, check["ref_records"]),
        "flushes": probe.stats.flushes, "names": dict(names.most_common()),
        **check,
    }
    if dtype is not None and raw_buffers:
        out["synthetic"] = _time_decoders(b"".join(raw_buffers), dtype, cupti,
                                          _next_record_fn(probe._backend.lib))
    return out


def _time_decoders(raw: bytes, dtype: Any, cupti: Any, next_record: Any, target: int = 60_000,
                   objects: int = 20_000) -> dict:
    """Per-record cost of numpy decode vs cupti-python objects on the same (tiled) records."""
    import numpy as np

    from argus_exporters.kernels import NameTable, decode_kernel_buffer, read_c_string

    itemsize = dtype.itemsize
    n = len(raw) // itemsize
    reps = max(1, -(-target // n))
    big = np.frombuffer(bytearray(raw[: n * itemsize] * reps), dtype=np.uint8)
    count = len(big) // itemsize
    table = NameTable()
    decode_kernel_buffer(big, len(big), table, read_c_string, dtype=dtype)  # warm the names
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        cols = decode_kernel_buffer(big, len(big), table, read_c_string, dtype=dtype)
        best = min(best, time.perf_counter() - t0)
    fresh_t0 = time.perf_counter()
    decode_kernel_buffer(big, len(big), NameTable(), read_c_string, dtype=dtype)
    fresh = time.perf_counter() - fresh_t0
    cls = _kernel_class(cupti, dtype)
    base = big.ctypes.data
    m = min(objects, count)
    rows, keep = [], []
    t0 = time.perf_counter()
    for i in range(m):
        obj = cls.from_ptr(base + i * itemsize, readonly=True)
        keep.append(obj)
        rows.append((obj.start, obj.end, obj.stream_id, obj.name))
    objects_s = time.perf_counter() - t0
    _KEEP.append(keep)
    t0 = time.perf_counter()
    walked = 0
    record = ctypes.c_void_p(None)
    while walked < m and next_record(base, m * itemsize, ctypes.byref(record)) == 0:
        walked += 1
    walk_s = time.perf_counter() - t0
    numpy_us = 1e6 * best / count
    objects_us = 1e6 * objects_s / m  # create + 4 reads; dealloc not included
    same = all(r == (int(cols.start_ns[i]), int(cols.start_ns[i] + cols.dur_ns[i]),
                     int(cols.stream[i]), cols.names[cols.name[i]])
               for i, r in enumerate(rows[:1000]))
    return {"records": count, "numpy_us_per_record": numpy_us,
            "numpy_cold_names_us_per_record": 1e6 * fresh / count,
            "objects_from_ptr_us_per_record": objects_us,
            "get_next_record_us_per_record": 1e6 * walk_s / max(1, walked),
            "speedup": objects_us / numpy_us if numpy_us else None,
            "first_1000_agree": same}


def child_overhead(steps: int, inner: int) -> dict:
    """Mean synchronised step time with the probe off, then on (duty 1)."""
    import statistics

    import torch

    from argus_exporters.health import Health
    from argus_exporters.kernels import KernelProbe

    step = _make_workload(inner)
    for _ in range(3):
        step()
    torch.cuda.synchronize()

    def timed(probe) -> list[float]:
        out = []
        for s in range(steps):
            t0 = time.perf_counter()
            if probe:
                probe.step_begin(s)
            step()
            if probe:
                probe.step_end(s)
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return out

    off = timed(None)
    health, emitted = Health(), []
    probe = KernelProbe(_settings(1), _identity(), emitted.append, health)
    if not probe.start():
        return {"started": False, "state": list(probe.state or ())}
    on = timed(probe)
    off2 = timed(None)  # CUPTI still enabled: kernels are recorded, hooks not called
    probe.shutdown()
    return {"started": True, "step_ms_off": 1e3 * statistics.median(off),
            "step_ms_on": 1e3 * statistics.median(on),
            "step_ms_cupti_on_no_hooks": 1e3 * statistics.median(off2),
            "overhead_pct": 100 * (statistics.median(on) / statistics.median(off) - 1),
            "records": probe.stats.records, "cpu_s": health.cpu_seconds,
            "dropped": dict(health.dropped), "toggle_s_max": probe.stats.toggle_s_max}


def child_duty(steps: int, inner: int) -> dict:
    """Duty 2: only traced steps' kernels arrive; enable/disable cost."""
    import numpy as np
    import torch
    from cupti import cupti

    from argus_exporters.health import Health
    from argus_exporters.kernels import KernelProbe

    step = _make_workload(inner)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    emitted: list[dict] = []
    health = Health()
    probe = KernelProbe(_settings(2), _identity(), emitted.append, health)
    if not probe.start():
        return {"started": False, "state": list(probe.state or ())}
    windows = []
    for s in range(steps):
        t_begin = cupti.get_timestamp()
        probe.step_begin(s)
        step()
        torch.cuda.synchronize()
        probe.step_end(s)
        if s % 2 == 0:
            windows.append((t_begin, cupti.get_timestamp()))
    probe.shutdown()
    starts = np.concatenate([r["start_ns"] for r in emitted]) if emitted else np.empty(0)
    inside = np.zeros(len(starts), dtype=bool)
    for lo, hi in windows:
        inside |= (starts >= lo) & (starts <= hi)
    traced = len(windows)
    return {"started": True, "steps": steps, "traced_steps": traced, "records": len(starts),
            "records_per_traced_step": len(starts) / max(1, traced),
            "kernels_outside_traced_steps": int((~inside).sum()),
            "toggles": probe.stats.toggles, "toggle_ms_max": 1e3 * probe.stats.toggle_s_max,
            "dropped": dict(health.dropped)}


def child_objects(steps: int, inner: int) -> dict:
    """cupti-python's own callback path: one Python object per record."""
    import torch
    from cupti import cupti

    step = _make_workload(inner)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    kind = cupti.ActivityKind.CONCURRENT_KERNEL
    names: Counter = Counter()
    counts = {"records": 0, "callback_s": 0.0, "buffers": 0}

    def requested():
        return 8 << 20, 0

    def completed(activities):
        t0 = time.perf_counter()
        counts["buffers"] += 1
        for a in activities:
            if a.kind == kind:
                counts["records"] += 1
                names[a.name] += 1
                _ = (a.start, a.end, a.stream_id)
        counts["callback_s"] += time.perf_counter() - t0

    cupti.activity_register_callbacks(requested, completed)
    cupti.activity_enable(kind)
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    cupti.activity_flush_all(1)
    flush_s = time.perf_counter() - t0
    cupti.activity_disable(kind)
    n = max(1, counts["records"])
    return {"records": counts["records"], "buffers": counts["buffers"],
            "records_per_step": counts["records"] / steps,
            "flush_us_per_record": 1e6 * flush_s / n,
            "callback_us_per_record": 1e6 * counts["callback_s"] / n,
            "names": dict(names.most_common())}


CHILDREN = {"compare": child_compare, "overhead": child_overhead, "duty": child_duty,
            "objects": child_objects}


# ---- orchestration -------------------------------------------------------------------------------

def _run_child(part: str, steps: int, inner: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--steps", str(steps),
           "--inner", str(inner)]
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s",
                "stderr_tail": tail.decode("utf-8", "replace") if isinstance(tail, bytes)
                else tail}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:],
                "stdout_tail": proc.stdout[-1000:]}
    out = json.loads(lines[-1])
    out["child_wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def _summary(parts: dict) -> dict:
    compare, objects = parts.get("compare", {}), parts.get("objects", {})
    synthetic = compare.get("synthetic", {})
    summary = {
        "mismatches": compare.get("mismatches"),
        "tiling_mismatches": compare.get("tiling_mismatches"),
        "records_compared": compare.get("ref_records"),
        "record_dtype_itemsize": compare.get("itemsize"),
        "kernel_class": compare.get("kernel_class"),
        "numpy_us_per_record": synthetic.get("numpy_us_per_record"),
        "probe_decode_us_per_record": compare.get("probe_decode_us_per_record"),
        "objects_from_ptr_us_per_record": synthetic.get("objects_from_ptr_us_per_record"),
        "cupti_python_flush_us_per_record": objects.get("flush_us_per_record"),
        "speedup_vs_from_ptr": synthetic.get("speedup"),
        "overhead_pct": parts.get("overhead", {}).get("overhead_pct"),
        "duty_kernels_outside_traced_steps": parts.get("duty", {}).get(
            "kernels_outside_traced_steps"),
        "duty_records_per_traced_step": parts.get("duty", {}).get("records_per_traced_step"),
        "records_per_step_duty1": compare.get("records_per_step"),
        "subscribe_ok_with_torch_loaded": compare.get("subscribe", {}).get("ok"),
    }
    if compare.get("names") and objects.get("names"):
        a, b = Counter(compare["names"]), Counter(objects["names"])
        summary["name_count_diff_vs_cupti_python"] = sum(((a - b) + (b - a)).values())
    return summary


def main(argv: list[str] | None = None) -> int:
    """Run the parts in child processes and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--inner", type=int, default=30, help="workload repeats per step")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    reason = _no_gpu_reason()
    if args.child and not reason:
        faulthandler.dump_traceback_later(CHILD_TIMEOUT_S - 10, exit=True)  # hangs: say where
        result = CHILDREN[args.child](args.steps, args.inner)
        print(json.dumps(result, default=str), flush=True)
        sys.stderr.flush()
        os._exit(0)  # no teardown: the kept cupti-python objects must not die (see _KEEP)
    if reason:
        print(f"gpu_kernels_check: cannot run here: {reason}", file=sys.stderr)
        print(json.dumps({"ok": False, "error": reason}))
        return 2
    import torch

    parts = {}
    for part in [p.strip() for p in args.only.split(",") if p.strip()]:
        if part not in CHILDREN:
            parser.error(f"unknown part {part!r} (parts: {', '.join(PARTS)})")
        parts[part] = _run_child(part, args.steps, args.inner)
    from importlib.metadata import version

    summary = _summary(parts)
    ok = (not any("error" in p for p in parts.values())
          and summary.get("mismatches") in (0, None)
          and summary.get("tiling_mismatches") in (0, None))
    print(json.dumps({"ok": ok, "orjson_stubbed": ORJSON_STUBBED,
                      "device": torch.cuda.get_device_name(0),
                      "torch": torch.__version__, "cuda": torch.version.cuda,
                      "cupti_python": version("cupti-python"), "summary": summary,
                      "parts": parts}, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
