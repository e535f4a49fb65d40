"""The CUPTI kernel probe on a CPU: synthetic activity buffers in cupti-python's real record
dtype, decoded in bulk, and the probe's control/decode paths driven through a fake CUPTI.

Name interning (decided here, documented in exporters/kernels.py): a string is read once per
pointer value, and two pointers to the same text share one name id.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time

import numpy as np
import orjson
import pytest

from argus_core.schema import KernelBatch, parse_record
from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.kernels import (
    BUSY_STATUSES,
    CUPTI_ACTIVITY_FLAG_FLUSH_FORCED,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ERROR_MAX_LIMIT_REACHED,
    UNKNOWN_NAME,
    CuptiBackend,
    CuptiCallError,
    KernelProbe,
    NameTable,
    ParentInfo,
    UnknownRecordLayoutError,
    decode_kernel_buffer,
    kernel_record_dtypes,
    pick_record_dtype,
    read_c_string,
    state_for_status,
    training_process,
)
from argus_exporters.records import encode

cupti_module = pytest.importorskip("cupti.cupti")

KIND = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
DTYPES = kernel_record_dtypes()
DT = DTYPES[0]
IDENTITY = RankIdentity(job="j", rank=3, world_size=4, local_rank=3, host="h",
                        coords={"dp": 3, "tp": 0, "pp": 0, "ep": 0})

# C strings CUPTI would own; their addresses are the records' name pointers.
_STRINGS = {key: ctypes.create_string_buffer(text) for key, text in {
    "gemm": b"ampere_sgemm_128x64_tn", "gemm_again": b"ampere_sgemm_128x64_tn",
    "nccl": b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", "relu": b"vectorized_relu_kernel",
    "empty": b""}.items()}
PTR = {key: ctypes.addressof(buf) for key, buf in _STRINGS.items()}


def records(rows: list[tuple[int, int, int, int]], dtype: np.dtype = DT) -> np.ndarray:
    """Kernel records (start, end, stream, name pointer), as CUPTI lays them out."""
    out = np.zeros(len(rows), dtype=dtype)
    out["kind"] = KIND
    for field, column in zip(("start", "end", "stream_id", "name"), zip(*rows, strict=True),
                             strict=True):
        out[field] = column
    return out


ROWS = [
    (1_000_000, 1_000_500, 7, PTR["gemm"]),
    (1_000_600, 1_002_000, 13, PTR["nccl"]),
    (1_002_100, 1_002_150, 7, PTR["relu"]),
    (1_002_200, 1_002_700, 7, PTR["gemm_again"]),  # same text, other pointer
    (1_002_800, 1_003_300, 7, PTR["gemm"]),
]


class CountingReader:
    """read_name that counts reads per pointer."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def __call__(self, pointer: int) -> str:
        self.reads.append(pointer)
        return read_c_string(pointer)


# ---- cupti-python facts the probe relies on ---------------------------------------------------

def test_constants_match_cupti_python():
    assert int(cupti_module.ActivityKind.CONCURRENT_KERNEL) == KIND == 10
    assert int(cupti_module.ActivityFlag.FLUSH_FORCED) == CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
    assert cupti_module.Result(CUPTI_ERROR_MAX_LIMIT_REACHED).name == "ERROR_MAX_LIMIT_REACHED"
    for status, name in BUSY_STATUSES.items():
        assert cupti_module.Result(status).name == name
        assert state_for_status(status) == "busy"
    assert state_for_status(int(cupti_module.Result.ERROR_NOT_INITIALIZED)) == "unavailable"


def test_kernel_record_dtypes_newest_first_with_the_fields():
    assert DTYPES, "cupti-python ships activity_kernel*_dtype"
    names = [n for n in dir(cupti_module) if n.startswith("activity_kernel")]
    assert len(DTYPES) == len(names)
    assert np.dtype(cupti_module.activity_kernel10_dtype) == DT  # cupti-python 13.0.1
    assert DT.itemsize == 216
    for dtype in DTYPES:
        assert dtype.itemsize % 8 == 0
        assert dtype.fields["kind"][1] == 0  # CUpti_Activity header
        assert {"start", "end", "stream_id", "name"} <= set(dtype.names)


# ---- dtype picker --------------------------------------------------------------------------------

# An older, shorter layout with the same field names: 25 x 216 bytes also tile by 200.
OLD = np.dtype({"names": ["kind", "start", "end", "stream_id", "name"],
                "formats": ["<i4", "<u8", "<u8", "<u4", "<i8"],
                "offsets": [0, 16, 24, 48, 104], "itemsize": 200})


def test_pick_record_dtype_takes_the_fitting_candidate():
    buf = records(ROWS * 5).tobytes()
    assert pick_record_dtype(buf, len(buf), DTYPES) == DT
    assert len(buf) % OLD.itemsize == 0
    assert pick_record_dtype(buf, len(buf), [OLD, DT]) == DT  # tiles, but kinds are wrong
    assert pick_record_dtype(buf, len(buf), [OLD]) is None
    old_buf = records(ROWS, OLD).tobytes()
    assert pick_record_dtype(old_buf, len(old_buf), [DT, OLD]) == OLD


def test_pick_record_dtype_rejects_foreign_kinds_and_ragged_sizes():
    mixed = records(ROWS)
    mixed["kind"][2] = int(cupti_module.ActivityKind.KERNEL)
    buf = mixed.tobytes()
    assert pick_record_dtype(buf, len(buf), DTYPES) is None
    good = records(ROWS).tobytes() + bytes(8)
    assert pick_record_dtype(good, len(good), DTYPES) is None  # 5 x 216 + 8 does not tile
    assert pick_record_dtype(good, len(good) - 8, DTYPES) == DT  # valid_size, not len(buf)
    assert pick_record_dtype(good, 0, DTYPES) is None
    assert pick_record_dtype(good, len(good) + 216, DTYPES) is None  # beyond the buffer
    assert pick_record_dtype(good, len(good) - 8, []) is None


# ---- decoding ------------------------------------------------------------------------------------

def test_decode_returns_the_columns_put_in():
    table, reader = NameTable(), CountingReader()
    rec = records(ROWS)
    cols = decode_kernel_buffer(memoryview(rec.tobytes()), rec.nbytes, table, reader)
    assert cols.count == len(ROWS) and cols.skipped == 0 and cols.record_dtype == DT
    assert cols.start_ns.tolist() == [r[0] for r in ROWS]
    assert cols.dur_ns.tolist() == [r[1] - r[0] for r in ROWS]
    assert cols.stream.tolist() == [r[2] for r in ROWS]
    assert [cols.names[i] for i in cols.name] == [read_c_string(r[3]) for r in ROWS]
    assert sorted(cols.names) == sorted(set(cols.names))  # no string twice in a batch
    assert cols.name[0] == cols.name[3] == cols.name[4]  # two pointers, one text, one id
    assert sorted(reader.reads) == sorted({r[3] for r in ROWS})  # once per pointer
    assert cols.name.dtype == np.int32
    assert all(c.dtype == np.int64 for c in (cols.stream, cols.start_ns, cols.dur_ns))


def test_name_table_is_bounded_and_names_stay_right_across_resets():
    """New kernels forever (autotuning) never grow the table past its bound, and every
    buffer's names still match its records."""
    table, reader = NameTable(max_pointers=2), CountingReader()
    for _ in range(3):
        for rows in (ROWS[:2], ROWS[2:], ROWS):
            rec = records(rows)
            cols = decode_kernel_buffer(rec.tobytes(), rec.nbytes, table, reader)
            assert [cols.names[i] for i in cols.name] == [read_c_string(r[3]) for r in rows]
            assert len(table._by_pointer) <= 2 + len({r[3] for r in rows})
    assert table.resets >= 3


def test_decode_reads_each_pointer_once_across_buffers():
    table, reader = NameTable(), CountingReader()
    first = records(ROWS[:2])
    decode_kernel_buffer(first.tobytes(), first.nbytes, table, reader)
    second = records(ROWS)
    cols = decode_kernel_buffer(second.tobytes(), second.nbytes, table, reader)
    assert sorted(reader.reads) == sorted({r[3] for r in ROWS})
    assert len(table) == 3  # gemm, nccl, relu
    only_relu = records([ROWS[2]])
    cols = decode_kernel_buffer(only_relu.tobytes(), only_relu.nbytes, table, reader)
    assert cols.names == ["vectorized_relu_kernel"] and cols.name.tolist() == [0]


def test_decode_zero_valid_bytes_yields_nothing():
    cols = decode_kernel_buffer(records(ROWS).tobytes(), 0, NameTable(), CountingReader())
    assert cols.count == 0 and cols.names == [] and len(cols.name) == 0


def test_decode_uses_valid_size_not_the_buffer_length():
    buf = bytearray(4096)
    rec = records(ROWS)
    buf[:rec.nbytes] = rec.tobytes()
    buf[rec.nbytes:rec.nbytes + 4] = (123).to_bytes(4, "little")  # stale bytes past valid
    cols = decode_kernel_buffer(buf, rec.nbytes, NameTable(), read_c_string)
    assert cols.count == len(ROWS)


def test_decode_skips_records_without_timestamps_and_names_null_pointers():
    rows = [*ROWS[:2], (5_000, 0, 7, PTR["relu"]), (0, 0, 7, PTR["relu"]),
            (6_000, 6_100, 9, 0), (7_000, 7_050, 9, PTR["empty"])]
    rec = records(rows)
    cols = decode_kernel_buffer(rec.tobytes(), rec.nbytes, NameTable(), read_c_string)
    assert cols.skipped == 2 and cols.count == 4
    assert cols.start_ns.tolist() == [1_000_000, 1_000_600, 6_000, 7_000]
    assert [cols.names[i] for i in cols.name][2:] == [UNKNOWN_NAME, UNKNOWN_NAME]
    assert UNKNOWN_NAME in cols.names and len(cols.names) == 3


def test_decode_falls_back_from_a_stale_cached_dtype_and_rejects_unknown_layouts():
    rec = records(ROWS)
    cols = decode_kernel_buffer(rec.tobytes(), rec.nbytes, NameTable(), read_c_string,
                                dtype=OLD, candidates=DTYPES)
    assert cols.record_dtype == DT and cols.count == len(ROWS)
    bad = records(ROWS)
    bad["kind"] = int(cupti_module.ActivityKind.MEMCPY)
    with pytest.raises(UnknownRecordLayoutError):
        decode_kernel_buffer(bad.tobytes(), bad.nbytes, NameTable(), read_c_string)


def test_decoded_columns_do_not_alias_the_buffer():
    buf = bytearray(records(ROWS).tobytes())
    cols = decode_kernel_buffer(buf, len(buf), NameTable(), read_c_string)
    buf[:] = bytes(len(buf))  # CUPTI reuses the buffer
    assert cols.start_ns.tolist() == [r[0] for r in ROWS]


# ---- which processes trace -----------------------------------------------------------------------

RANK_ENV = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
TORCHRUN = ParentInfo(frozenset({"PATH"}), ("/usr/bin/python3", "/usr/local/bin/torchrun",
                                             "--nproc-per-node=2", "train.py"))
RANK_PARENT = ParentInfo(frozenset({"RANK", "LOCAL_RANK"}), ("/usr/bin/python3.12", "train.py"))


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"env": RANK_ENV, "parent": TORCHRUN}, True),
    ({"env": RANK_ENV, "parent": TORCHRUN, "mp_child": True}, True),  # torchrun fn entrypoint
    ({"env": {}, "parent": TORCHRUN}, False),  # the launcher itself, or a plain script
    ({"env": RANK_ENV, "parent": RANK_PARENT}, False),  # compile/DataLoader worker of a rank
    ({"env": RANK_ENV, "parent": RANK_PARENT, "worker_info": object()}, False),
    ({"env": RANK_ENV, "parent": RANK_PARENT, "forced": True}, True),
    ({"env": RANK_ENV, "parent": TORCHRUN, "forced": False}, False),
    ({"env": RANK_ENV, "parent": TORCHRUN, "worker_info": object(), "forced": True}, False),
    # a pod that sets RANK for every process, the rank started through a shell
    ({"env": RANK_ENV, "parent": ParentInfo(frozenset({"RANK"}), ("/bin/sh", "-c", "x"))}, True),
    ({"env": RANK_ENV, "parent": TORCHRUN, "argv0": "/x/torch/_inductor/compile_worker"}, False),
    ({"env": RANK_ENV, "parent": None, "mp_child": True}, False),  # no /proc: the rule
    ({"env": {**RANK_ENV, "TORCHELASTIC_RUN_ID": "r"}, "parent": None, "mp_child": True}, True),
    ({"env": RANK_ENV, "parent": None}, True),
])
def test_training_process_rule(kwargs, expected):
    env = kwargs.pop("env")
    ok, why = training_process(env, **kwargs)
    assert ok is expected and why


# ---- the probe without a GPU ---------------------------------------------------------------------

def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def make_settings(**overrides) -> Settings:
    base = {"enabled": True, "kernels": True, "kernel_buffer_bytes": 4096, "kernel_buffers": 4,
            "kernel_flush_s": 0.01, "extra": {"training_rank": True}}
    return Settings(**{**base, **overrides})


@pytest.mark.skipif(_driver_present(), reason="a CUDA driver is present: start() may succeed")
def test_start_is_unavailable_on_a_cpu_machine_and_hooks_do_nothing(caplog):
    health, emitted = Health(), []
    probe = KernelProbe(make_settings(), IDENTITY, emitted.append, health, env=RANK_ENV)
    with caplog.at_level(logging.INFO, logger="argus_exporters"):
        assert probe.start() is False
        assert probe.start() is False  # idempotent: no second report
        for step in range(3):
            probe.step_begin(step)
            probe.step_end(step)
        probe.shutdown()
        probe.shutdown(timeout=0.1)
    state, reason = health.probes["kernels"]
    assert state == "unavailable" and reason
    assert len([r for r in caplog.records if "kernels probe" in r.getMessage()]) == 1
    assert emitted == [] and not health.dropped


def test_start_reports_off_and_skipped():
    health = Health()
    assert not KernelProbe(make_settings(kernels=False), IDENTITY, print, health).start()
    assert health.probes["kernels"][0] == "off"
    probe = KernelProbe(make_settings(extra={}), IDENTITY, print, health, env={},
                        backend=FakeCupti())
    assert not probe.start()
    assert health.probes["kernels"][0] == "skipped"
    assert "RANK" in health.probes["kernels"][1]


# ---- the probe with a fake CUPTI -----------------------------------------------------------------

class FakeCupti:
    """CuptiControl without CUPTI: records the calls, hands the callbacks to the test."""

    def __init__(self, register_status: int = 0, enable_status: int = 0):
        self.register_status = register_status
        self.enable_status = enable_status
        self.calls: list[str] = []
        self.flushes = 0
        self.request = None
        self.complete = None
        self.reader = CountingReader()

    def record_dtypes(self):
        return kernel_record_dtypes()

    def register(self, request, complete):
        if self.register_status:
            raise CuptiCallError(self.register_status, "cuptiActivityRegisterCallbacks")
        self.request, self.complete = request, complete

    def enable(self):
        self.calls.append("enable")
        if self.enable_status:
            raise CuptiCallError(self.enable_status, "cuptiActivityEnable")

    def disable(self):
        self.calls.append("disable")

    def flush(self, forced):
        assert forced
        self.flushes += 1

    def read_name(self, pointer):
        return self.reader(pointer)

    def describe(self):
        return "fake CUPTI"

    def fill(self, rec: np.ndarray) -> int:
        """What CUPTI does: take a buffer, write records, hand it back. Returns the address."""
        address, size = self.request()
        assert address and address % 8 == 0 and size >= rec.nbytes
        ctypes.memmove(address, rec.ctypes.data, rec.nbytes)
        self.complete(address, rec.nbytes)
        return address


def started(fake: FakeCupti, emit=None, health: Health | None = None, queue_size=None,
            **overrides) -> tuple[KernelProbe, Health, list]:
    health = health or Health()
    out: list = []
    probe = KernelProbe(make_settings(**overrides), IDENTITY, emit or out.append, health,
                        backend=fake, env=RANK_ENV, queue_size=queue_size)
    assert probe.start(), health.probes
    assert health.probes["kernels"][0] == "on"
    return probe, health, out


def parsed(record: dict) -> KernelBatch:
    batch = parse_record(orjson.loads(encode(record)))
    assert isinstance(batch, KernelBatch)
    return batch


def test_decode_thread_emits_schema_valid_kernel_records():
    fake = FakeCupti()
    probe, health, out = started(fake)
    probe.step_begin(0)
    fake.fill(records(ROWS[:3]))
    fake.fill(records(ROWS[2:]))
    fake.complete(fake.request()[0], 0)  # an empty buffer: back to the pool, no record
    probe.step_end(0)
    probe.shutdown()
    assert len(out) == 2 and not health.dropped
    first, second = (parsed(r) for r in out)
    assert (first.job, first.rank) == ("j", 3)
    assert first.start_ns.tolist() == [r[0] for r in ROWS[:3]]
    assert second.dur_ns.tolist() == [r[1] - r[0] for r in ROWS[2:]]
    assert second.stream.tolist() == [r[2] for r in ROWS[2:]]
    assert [second.names[i] for i in second.name] == [read_c_string(r[3]) for r in ROWS[2:]]
    assert len(second.names) == 2  # relu, gemm (two pointers, one name)
    assert sorted(fake.reader.reads) == sorted({r[3] for r in ROWS})
    assert probe.stats.records == len(ROWS) + 1 and probe.stats.buffers == 2


def test_buffers_return_to_the_pool():
    fake = FakeCupti()
    probe, health, out = started(fake, kernel_buffers=2)
    for _ in range(6):  # more rounds than buffers: each one came back
        fake.fill(records(ROWS))
        deadline = time.monotonic() + 5
        while len(probe._pool) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    probe.shutdown()
    assert len(out) == 6 and not health.dropped


def test_pool_empty_is_dropped_and_counted():
    fake = FakeCupti()
    probe, health, _ = started(fake, kernel_buffers=2)
    first, second = fake.request(), fake.request()
    assert first[0] and second[0] and first[0] != second[0]
    assert fake.request() == (0, 0)
    assert fake.request() == (0, 0)
    assert health.dropped["kernel_buffer_pool_empty"] == 2
    fake.complete(first[0], 0)
    assert fake.request()[0] == first[0]
    probe.shutdown()


def test_queue_full_is_dropped_and_counted():
    entered, release = threading.Event(), threading.Event()
    out: list = []

    def slow_emit(record):
        out.append(record)
        entered.set()
        release.wait(5)

    fake = FakeCupti()
    probe, health, _ = started(fake, emit=slow_emit, queue_size=1)
    fake.fill(records(ROWS))  # taken by the decode thread, which then blocks in emit
    assert entered.wait(5)
    fake.fill(records(ROWS[:2]))  # waits in the queue (depth 1)
    address = fake.fill(records(ROWS[:3]))  # queue full: dropped, buffer recycled
    assert health.dropped["kernel_queue_full"] == 3
    assert address in probe._pool
    release.set()
    probe.shutdown()
    assert [len(r["start_ns"]) for r in out] == [5, 2]


def test_foreign_buffers_are_never_touched():
    fake = FakeCupti()
    probe, health, out = started(fake)
    stranger = records(ROWS)
    fake.complete(stranger.ctypes.data, stranger.nbytes)
    probe.shutdown()
    assert out == [] and not health.dropped


def test_unknown_layout_is_dropped_counted_and_reported():
    fake = FakeCupti()
    probe, health, out = started(fake)
    bad = records(ROWS)
    bad["kind"] = int(cupti_module.ActivityKind.MEMCPY)
    fake.fill(bad)
    probe.shutdown()
    assert out == [] and health.dropped["kernel_record_layout_unknown"] == len(ROWS)
    assert health.probes["kernels"][0] == "degraded"


def test_incomplete_records_are_counted():
    fake = FakeCupti()
    probe, health, out = started(fake)
    fake.fill(records([*ROWS, (9_000, 0, 7, PTR["gemm"])]))
    probe.shutdown()
    assert len(out[0]["start_ns"]) == len(ROWS)
    assert health.dropped["kernel_incomplete_record"] == 1


def test_emit_errors_are_counted_not_raised():
    def broken(record):
        raise RuntimeError("sink gone")

    fake = FakeCupti()
    probe, health, _ = started(fake, emit=broken)
    fake.fill(records(ROWS))
    probe.shutdown()
    assert health.dropped["kernel_emit_error"] == len(ROWS)


@pytest.mark.parametrize(("duty", "expected"), [
    (1, ["enable", "disable"]),  # on once, off at shutdown
    (3, ["enable", "disable"] * 3),  # steps 0, 3 and 6 of 0..7
])
def test_duty_cycle(duty, expected):
    fake = FakeCupti()
    probe, _, _ = started(fake, kernel_duty=duty)
    for step in range(8):
        probe.step_begin(step)
        probe.step_end(step)
    probe.shutdown()
    assert fake.calls == expected


def test_flush_timer_runs_once_tracing():
    fake = FakeCupti()
    probe, _, _ = started(fake)
    probe.step_begin(0)
    deadline = time.monotonic() + 5
    while fake.flushes < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    probe.shutdown()
    assert fake.flushes >= 2


@pytest.mark.parametrize("status", sorted(BUSY_STATUSES))
def test_busy_cupti_at_register(status):
    health = Health()
    probe = KernelProbe(make_settings(), IDENTITY, print, health, env=RANK_ENV,
                        backend=FakeCupti(register_status=status))
    assert probe.start() is False
    assert health.probes["kernels"][0] == "busy"
    assert BUSY_STATUSES[status] in health.probes["kernels"][1]
    probe.step_begin(0)
    probe.shutdown()


def test_busy_cupti_at_enable_goes_quiet(caplog):
    fake = FakeCupti(enable_status=39)
    probe, health, _ = started(fake, kernel_duty=2)
    with caplog.at_level(logging.INFO, logger="argus_exporters"):
        for step in range(6):
            probe.step_begin(step)
            probe.step_end(step)
        probe.shutdown()
    assert fake.calls == ["enable"]
    assert health.probes["kernels"][0] == "busy"
    assert len([r for r in caplog.records if "kernels probe busy" in r.getMessage()]) == 1


def test_injected_cupti_tool_is_busy():
    fake = FakeCupti()
    health = Health()
    probe = KernelProbe(make_settings(), IDENTITY, print, health, backend=fake,
                        env={**RANK_ENV,
                             "CUDA_INJECTION64_PATH": "/opt/nsys/libToolsInjection64.so"})
    assert probe.start() is False
    assert health.probes["kernels"][0] == "busy" and fake.request is None


def test_torch_profiler_makes_the_probe_busy():
    torch = pytest.importorskip("torch")
    fake = FakeCupti()
    probe, health, _ = started(fake)
    probe.step_begin(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        probe.step_begin(1)
    probe.step_begin(2)
    probe.shutdown()
    assert fake.calls == ["enable"]  # nothing after the profiler took over
    assert health.probes["kernels"][0] == "busy"
    health2 = Health()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        late = KernelProbe(make_settings(), IDENTITY, print, health2, backend=FakeCupti(),
                           env=RANK_ENV)
        assert late.start() is False
    assert health2.probes["kernels"][0] == "busy"


# ---- the ctypes trampolines, called the way libcupti calls them ------------------------------

class _FakeFunction:
    def __init__(self, fn):
        self.fn, self.argtypes, self.restype = fn, None, None

    def __call__(self, *args):
        return self.fn(*args)


class _FakeLib:
    _name = "libcupti-fake.so"

    def __init__(self) -> None:
        self.registered: tuple = ()
        self.cuptiActivityRegisterCallbacks = _FakeFunction(self._register)
        self.cuptiActivityFlushAll = _FakeFunction(lambda flag: 0)

    def _register(self, request, complete):
        self.registered = (request, complete)
        return 0


def test_ctypes_trampolines_follow_the_cupti_signatures():
    lib = _FakeLib()
    backend = CuptiBackend(cupti_module, lib)
    completed: list = []
    answers = iter([(0x1000, 4096), (0, 0)])
    backend.register(lambda: next(answers), lambda a, v: completed.append((a, v)))
    request, complete = lib.registered
    buffer, size, max_records = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t(99)
    request(ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(max_records))
    assert (buffer.value, size.value, max_records.value) == (0x1000, 4096, 0)
    request(ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(max_records))
    assert (buffer.value, size.value) == (None, 0)  # pool empty: CUPTI gets no buffer
    complete(None, 7, 0x1000, 4096, 648)
    assert completed == [(0x1000, 648)]
    backend.flush(True)
    lib.cuptiActivityRegisterCallbacks = _FakeFunction(lambda req, comp: 39)
    with pytest.raises(CuptiCallError) as err:
        backend.register(lambda: (0, 0), lambda a, v: None)
    assert err.value.status == 39
