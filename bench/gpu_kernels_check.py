"""GPU check of the CUPTI kernel probe (exporters/kernels/): correctness, decode cost, time base.

    python bench/gpu_kernels_check.py [--steps 30] [--inner 30] [--only compare,mixed,...]
                                      [--deadline-s 240] [--out PATH] [--dry-run]

Wheels (the H200 machine has torch 2.11 but no cupti-python and no orjson; bench/gpu_all.sh
installs them from ``.whl/``): ``cupti-python==13.0.1`` cp312 manylinux x86_64 (needed: record
dtypes, matching its CUPTI 13.0.85) and ``orjson`` cp312 (optional here: stubbed if missing,
this check never encodes a record). torch 2.11 has no native CUPTI callbacks, so the probe
uses the Argus C shim: gpu_all.sh builds it with gcc and sets ARGUS_CUPTI_SHIM (the probe
would also build it itself into ~/.cache/argus).

Each part runs in its own child process (CUPTI state is per process), at most 90 s each and
all of them within ``--deadline-s`` (a part that no longer fits is reported ``skipped``), on
the same small workload: matmuls, pointwise ops and a reduction on the default stream plus a
matmul/softmax on a side stream, ``--inner`` times per step (~300 kernels per step by default).

- ``compare``: the probe on (duty 1). Every completed buffer is also walked the CUPTI way,
  ``cuptiActivityGetNextRecord`` + cupti-python's per-record object (``ActivityKernel<N>.
  from_ptr``), before the probe decodes it; the emitted record is compared record for record
  (start, dur, stream, name): ``mismatches``; ``tiling_mismatches`` counts records CUPTI did
  not place at i * itemsize. The captured records, tiled into one large buffer, time the numpy
  decode against the from_ptr objects and the GetNextRecord walk per record. Also the CUPTI
  clock's offset from the host's (``time.time_ns() - cuptiGetTimestamp()``) and which
  callbacks the probe used.
- ``mixed``: the probe on while another activity kind (RUNTIME) is enabled too, as another
  CUPTI user would: buffers then hold both kinds; kernels per step must match ``compare``, the
  RUNTIME records are counted, nothing is dropped as layout-unknown.
- ``overhead``: median synchronised step time, probe off and on, ABBA segments.
- ``duty``: duty 2; kernels must start inside the traced steps' windows.
- ``objects``: cupti-python's own callback path (Python callbacks, one object per record):
  time per record of the final forced flush, and the kernel-name counts versus ``compare``.

``ok`` needs every part but ``objects`` run without error (``objects`` registers Python
callbacks, the design that can deadlock, so its timeout is reported, not failed), no
mismatch, no tiling mismatch, no kernel dropped as incomplete or layout-unknown, the clock
offset within 1 ms, and ``mixed`` keeping every kernel. Prints one JSON object (last line)
and writes it to ``--out`` (default ``$OUT/gpu_kernels_check.json`` when ``OUT`` is set).
Exit 0 ok, 1 not ok, 2 no GPU (with ``{"ok": false, "error": ...}``). ``--dry-run`` needs no
GPU: each child only imports the probe from this checkout and picks its callbacks (building
the shim), which CI runs.

One script past 500 lines on purpose: it runs on the device machine from a plain checkout
(standard library and torch only), so its parts cannot share helpers with argus_core.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _gpu_env import (
    Deadline,
    default_out,
    ensure_argus_exporters,
    finish,
    no_gpu_reason,
    stub_orjson,
    versions,
)

PARTS = ("compare", "mixed", "overhead", "duty", "objects")
INFORMATIVE = ("objects",)  # cupti-python's own Python callbacks: may hang (issue 13), not ours
CHILD_TIMEOUT_S = 90
MIN_CHILD_S = 20  # a part is not started with less time than this left
CLOCK_LIMIT_NS = 1_000_000
RUNTIME_KIND = 5  # cupti.cupti.ActivityKind.RUNTIME

ORJSON_STUBBED = stub_orjson()
ARGUS_FROM = ensure_argus_exporters()


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

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return step


def _settings(duty: int):
    from argus_exporters.config import Settings

    return Settings(enabled=True, kernels=True, kernel_duty=duty, kernel_flush_s=0.2,
                    kernel_buffer_bytes=8 << 20, kernel_buffers=8,
                    kernel_callbacks=os.environ.get("ARGUS_KERNEL_CALLBACKS", "auto"),
                    extra={"training_rank": True})


def _identity():
    from argus_exporters.identity import RankIdentity

    return RankIdentity(job="gpu-check", rank=0, world_size=1, local_rank=0, host="h",
                        coords={"dp": 0, "tp": 0, "pp": 0, "ep": 0})


def _probe(duty: int, emitted: list, cls: Any = None):
    from argus_exporters.health import Health
    from argus_exporters.kernels import KernelProbe

    health = Health()
    probe = (cls or KernelProbe)(_settings(duty), _identity(), emitted.append, health)
    return probe, health


def _started(probe) -> dict:
    return {"started": False, "state": list(probe.state or ())}


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


def _walk(next_record, address: int, valid: int, cls: Any | None, kind: int):
    """CUPTI's own iteration; rows (offset, kind, start, end, stream, name) via objects."""
    rows, record = [], ctypes.c_void_p(None)
    while True:
        status = next_record(address, valid, ctypes.byref(record))
        if status == 12:  # CUPTI_ERROR_MAX_LIMIT_REACHED
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


def _names(emitted: list[dict]) -> Counter:
    names: Counter = Counter()
    for rec in emitted:
        for i in rec["name"].tolist():
            names[rec["names"][i]] += 1
    return names


def _probe_summary(probe, health, steps: int) -> dict:
    stats = probe.stats
    return {"state": list(probe.state or ()), "plumbing": probe._plumbing.name,
            "records": stats.records, "records_per_step": stats.records / steps,
            "buffers": stats.buffers, "walked_buffers": stats.walked_buffers,
            "other_records": stats.other_records, "flushes": stats.flushes,
            "cupti_dropped": stats.cupti_dropped, "dropped": dict(health.dropped),
            "clock_offset_ns": stats.clock_offset_ns,
            "decode_us_per_record": 1e6 * stats.decode_s / max(1, stats.records),
            "cpu_s": health.cpu_seconds}


# ---- children ------------------------------------------------------------------------------------

def child_compare(steps: int, inner: int) -> dict:
    """Probe on, duty 1; reference walk on the same buffers; decode timings; clock offset."""
    import torch
    from cupti import cupti

    from argus_exporters.kernels import CONCURRENT_KERNEL as KIND
    from argus_exporters.kernels import KernelProbe, pick_record_dtype

    step = _make_workload(inner)
    emitted: list[dict] = []
    check = {"ref_records": 0, "decoded": 0, "mismatches": 0, "tiling_mismatches": 0,
             "foreign_kinds": 0, "walk_errors": [], "walk_s": 0.0, "examples": []}
    raw_buffers: list[bytes] = []

    class CheckedProbe(KernelProbe):
        def _decode(self, item) -> None:
            raw = ctypes.string_at(item.address, item.valid_size) if item.valid_size else b""
            raw_buffers.append(raw)
            dtype = self._dtype or pick_record_dtype(raw, len(raw), self._candidates)
            cls = _kernel_class(cupti, dtype) if dtype is not None else None
            t0 = time.perf_counter()
            next_record = self._backend.functions["cuptiActivityGetNextRecord"]
            rows, error = _walk(next_record, item.address, item.valid_size, cls, KIND)
            check["walk_s"] += time.perf_counter() - t0
            if error:
                check["walk_errors"].append(error)
            before = len(emitted)
            super()._decode(item)
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
                check["examples"].append({"reference": list(bad[0][0]),
                                          "probe": list(bad[0][1])})

    probe, health = _probe(1, emitted, CheckedProbe)
    if not probe.start():
        return _started(probe)
    offsets = []
    t0 = time.perf_counter()
    for s in range(steps):
        probe.step_begin(s)
        step()
        probe.step_end(s)
        if s % 10 == 0:
            offsets.append(probe._backend.clock_offset_ns())
    torch.cuda.synchronize()
    run_s = time.perf_counter() - t0
    probe.shutdown()
    offsets.append(probe._backend.clock_offset_ns())
    dtype = probe._dtype
    out = {
        "started": True, **_probe_summary(probe, health, steps),
        "cupti": probe._backend.describe(),
        "itemsize": dtype.itemsize if dtype else None,
        "kernel_class": _kernel_class(cupti, dtype).__name__ if dtype else None,
        "steps": steps, "run_s": run_s, "emitted_records": len(emitted),
        "walk_objects_us_per_record_in_thread": 1e6 * check.pop("walk_s") / max(
            1, check["ref_records"]),
        "clock_offsets_ns": offsets, "clock_offset_max_abs_ns": max(abs(o) for o in offsets),
        "names": dict(_names(emitted).most_common()), **check,
    }
    if dtype is not None and raw_buffers:
        out["synthetic"] = _time_decoders(b"".join(raw_buffers), dtype, cupti,
                                          probe._backend.functions["cuptiActivityGetNextRecord"])
    return out


def _time_decoders(raw: bytes, dtype: Any, cupti: Any, next_record: Any, target: int = 60_000,
                   objects: int = 20_000) -> dict:
    """Per-record cost of numpy decode vs cupti-python objects on the same (tiled) records."""
    import numpy as np

    from argus_exporters.kernels import decode_kernel_buffer, read_c_string

    itemsize = dtype.itemsize
    n = len(raw) // itemsize
    reps = max(1, -(-target // n))
    big = np.frombuffer(bytearray(raw[: n * itemsize] * reps), dtype=np.uint8)
    count = len(big) // itemsize
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        cols = decode_kernel_buffer(big, len(big), read_c_string, dtype=dtype)
        best = min(best, time.perf_counter() - t0)
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
    valid = np.flatnonzero(cols.dur_ns >= 0)
    same = all(r == (int(cols.start_ns[i]), int(cols.start_ns[i] + cols.dur_ns[i]),
                     int(cols.stream[i]), cols.names[cols.name[i]])
               for i, r in zip(valid[:1000].tolist(), rows[:1000], strict=False))
    return {"records": count, "numpy_us_per_record": numpy_us,
            "objects_from_ptr_us_per_record": objects_us,
            "get_next_record_us_per_record": 1e6 * walk_s / max(1, walked),
            "speedup": objects_us / numpy_us if numpy_us else None,
            "first_1000_agree": same}


def child_mixed(steps: int, inner: int) -> dict:
    """The probe while RUNTIME records share its buffers (another CUPTI user)."""
    import torch

    step = _make_workload(inner)
    emitted: list[dict] = []
    probe, health = _probe(1, emitted)
    if not probe.start():
        return _started(probe)
    probe._backend.enable(RUNTIME_KIND)  # what another CUPTI client would switch on
    for s in range(steps):
        probe.step_begin(s)
        step()
        probe.step_end(s)
    torch.cuda.synchronize()
    probe.shutdown()
    probe._backend.disable(RUNTIME_KIND)
    return {"started": True, **_probe_summary(probe, health, steps),
            "names": dict(_names(emitted).most_common())}


def child_overhead(steps: int, inner: int) -> dict:
    """Median synchronised step time, probe off and on, ABBA segments (off: paused, drained)."""
    import torch

    step = _make_workload(inner)
    emitted: list[dict] = []
    probe, health = _probe(1, emitted)
    if not probe.start():
        return _started(probe)
    probe.pause()
    probe.drain()

    def timed(on: bool) -> list[float]:
        out = []
        for s in range(steps):
            t0 = time.perf_counter()
            if on:
                probe.step_begin(s)
            step()
            if on:
                probe.step_end(s)
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        if on:
            probe.pause()
            probe.drain()
        return out

    off, on = [], []
    for order in ((False, True, True, False), (False, True, True, False)):
        for segment in order:
            (on if segment else off).extend(timed(segment))
    probe.shutdown()
    return {"started": True, "step_ms_off": 1e3 * statistics.median(off),
            "step_ms_on": 1e3 * statistics.median(on),
            "overhead_pct": 100 * (statistics.median(on) / statistics.median(off) - 1),
            "toggle_s_max": probe.stats.toggle_s_max, **_probe_summary(probe, health, steps)}


def child_duty(steps: int, inner: int) -> dict:
    """Duty 2: only traced steps' kernels arrive; enable/disable cost."""
    import numpy as np
    import torch

    step = _make_workload(inner)
    emitted: list[dict] = []
    probe, health = _probe(2, emitted)
    if not probe.start():
        return _started(probe)
    clock = probe._backend.timestamp
    windows = []
    for s in range(steps):
        t_begin = clock()
        probe.step_begin(s)
        step()
        torch.cuda.synchronize()
        probe.step_end(s)
        if s % 2 == 0:
            windows.append((t_begin, clock()))
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


def child_dry_run(part: str) -> dict:
    """No GPU: import the probe from this checkout and pick its callbacks (may build the shim)."""
    from argus_exporters.kernels import KernelProbe  # noqa: F401
    from argus_exporters.kernels.cupti import ProbeUnavailableError
    from argus_exporters.kernels.plumbing import select_plumbing

    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
    settings = _settings(1)
    try:
        plumbing = select_plumbing(settings.kernel_callbacks, os.environ).name
    except ProbeUnavailableError as exc:
        plumbing = f"unavailable: {exc.reason}"
    return {"dry_run": True, "part": part, "argus_exporters": ARGUS_FROM, "plumbing": plumbing}


CHILDREN = {"compare": child_compare, "mixed": child_mixed, "overhead": child_overhead,
            "duty": child_duty, "objects": child_objects}


# ---- orchestration -------------------------------------------------------------------------------

def _run_child(part: str, args: argparse.Namespace, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--steps",
           str(args.steps), "--inner", str(args.inner)] + (["--dry-run"] if args.dry_run else [])
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr or b""
        tail = tail.decode("utf-8", "replace") if isinstance(tail, bytes) else tail
        return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": tail[-2000:]}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:],
                "stdout_tail": proc.stdout[-1000:]}
    out = json.loads(lines[-1])
    out["child_wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def _summary(parts: dict) -> dict:
    compare, mixed, objects = (parts.get(p, {}) for p in ("compare", "mixed", "objects"))
    synthetic = compare.get("synthetic", {})
    summary = {
        "plumbing": compare.get("plumbing"),
        "mismatches": compare.get("mismatches"),
        "tiling_mismatches": compare.get("tiling_mismatches"),
        "records_compared": compare.get("ref_records"),
        "record_dtype_itemsize": compare.get("itemsize"),
        "kernel_class": compare.get("kernel_class"),
        "clock_offset_max_abs_ns": compare.get("clock_offset_max_abs_ns"),
        "numpy_us_per_record": synthetic.get("numpy_us_per_record"),
        "probe_decode_us_per_record": compare.get("decode_us_per_record"),
        "objects_from_ptr_us_per_record": synthetic.get("objects_from_ptr_us_per_record"),
        "cupti_python_flush_us_per_record": objects.get("flush_us_per_record"),
        "speedup_vs_from_ptr": synthetic.get("speedup"),
        "overhead_pct": parts.get("overhead", {}).get("overhead_pct"),
        "duty_kernels_outside_traced_steps": parts.get("duty", {}).get(
            "kernels_outside_traced_steps"),
        "duty_records_per_traced_step": parts.get("duty", {}).get("records_per_traced_step"),
        "records_per_step_duty1": compare.get("records_per_step"),
        "mixed_records_per_step": mixed.get("records_per_step"),
        "mixed_other_records": mixed.get("other_records"),
        "dropped": {p: parts[p].get("dropped") for p in parts if parts[p].get("dropped")},
        "objects_error": objects.get("error"),
    }
    if compare.get("names") and objects.get("names"):
        a, b = Counter(compare["names"]), Counter(objects["names"])
        summary["name_count_diff_vs_cupti_python"] = sum(((a - b) + (b - a)).values())
    return summary


def _problems(parts: dict, summary: dict) -> list[str]:
    """Why the check is not ok (empty when it is)."""
    problems = [f"{p}: {r['error']}" for p, r in parts.items()
                if "error" in r and p not in INFORMATIVE]
    problems += [f"{p}: skipped ({r['skipped']})" for p, r in parts.items() if "skipped" in r]
    problems += [f"{p}: probe did not start {r.get('state')}" for p, r in parts.items()
                 if r.get("started") is False]
    for key in ("mismatches", "tiling_mismatches"):
        if summary.get(key):
            problems.append(f"{key} = {summary[key]}")
    for part, dropped in summary["dropped"].items():
        for reason in ("kernel_incomplete_record", "kernel_record_layout_unknown",
                       "kernel_decode_error"):
            if dropped.get(reason):
                problems.append(f"{part}: {dropped[reason]} records dropped as {reason}")
    offset = summary.get("clock_offset_max_abs_ns")
    if offset is not None and offset > CLOCK_LIMIT_NS:
        problems.append(f"CUPTI clock {offset} ns off the host clock")
    per_step, mixed = summary.get("records_per_step_duty1"), summary.get("mixed_records_per_step")
    if per_step and mixed is not None and abs(mixed - per_step) > 0.01 * per_step:
        problems.append(f"mixed: {mixed:.1f} kernels per step, {per_step:.1f} without RUNTIME")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the parts in child processes; print and write one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--inner", type=int, default=30, help="workload repeats per step")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--deadline-s", type=float, default=240.0,
                        help="overall budget for all parts")
    parser.add_argument("--out", default=default_out("gpu_kernels_check.json"),
                        help="also write the JSON here (default: $OUT/gpu_kernels_check.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: children only import the probe and pick its callbacks")
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in CHILDREN]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})")
    deadline = Deadline(args.deadline_s)

    reason = None if args.dry_run else no_gpu_reason(need_cupti=True)
    if args.child and (args.dry_run or not reason):
        if args.dry_run:
            result = child_dry_run(args.child)
        else:
            faulthandler.dump_traceback_later(CHILD_TIMEOUT_S - 5, exit=True)  # hangs: where
            result = CHILDREN[args.child](args.steps, args.inner)
        print(json.dumps(result, default=str), flush=True)
        sys.stderr.flush()
        os._exit(0)  # no teardown: the kept cupti-python objects must not die (see _KEEP)
    if reason:
        print(f"gpu_kernels_check: cannot run here: {reason}", file=sys.stderr)
        return finish({"ok": False, "error": reason, "versions": versions()}, args.out, 2)

    parts: dict[str, dict] = {}
    for part in chosen:
        left = deadline.remaining()
        if left < MIN_CHILD_S:
            parts[part] = {"skipped": f"deadline: {left:.0f} s left"}
            continue
        parts[part] = _run_child(part, args, min(CHILD_TIMEOUT_S, left))
    summary = _summary(parts)
    problems = _problems(parts, summary)
    device = None
    if not args.dry_run:
        import torch

        device = torch.cuda.get_device_name(0)
    result = {"ok": not problems, "problems": problems, "dry_run": args.dry_run,
              "device": device, "versions": versions(), "argus_exporters": ARGUS_FROM,
              "orjson_stubbed": ORJSON_STUBBED, "shim": os.environ.get("ARGUS_CUPTI_SHIM"),
              "summary": summary, "parts": parts}
    return finish(result, args.out, 0 if not problems else 1)


if __name__ == "__main__":
    sys.exit(main())
