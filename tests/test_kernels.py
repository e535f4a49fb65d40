"""Decoding CUPTI activity buffers on a CPU: synthetic buffers in cupti-python's real record
dtypes, decoded in bulk; mixed record kinds walked with CUPTI's own iteration (the libcupti
stand-in's cuptiActivityGetNextRecord, from C and from Python); which processes trace.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cupti_standin import RUNTIME_KIND, Standin, build_once

from argus_exporters.kernels import (
    BUSY_STATUSES,
    CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_FLAG_FLUSH_FORCED,
    CUPTI_ERROR_MAX_LIMIT_REACHED,
    UNKNOWN_NAME,
    CuptiLibrary,
    ParentInfo,
    RecordIndex,
    UnknownRecordLayoutError,
    decode_kernel_buffer,
    kernel_record_dtypes,
    pick_record_dtype,
    read_c_string,
    state_for_status,
    training_process,
)
from argus_exporters.kernels.plumbing import ShimLibrary

cupti_module = pytest.importorskip("cupti.cupti")

KIND = CONCURRENT_KERNEL
DTYPES = kernel_record_dtypes()
DT = DTYPES[0]
API = np.dtype(cupti_module.activity_api_dtype)

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


def runtime_record() -> bytes:
    """One RUNTIME activity record (another CUPTI user's), cupti-python's layout."""
    record = np.zeros(1, dtype=API)
    record["kind"] = RUNTIME_KIND
    return record.tobytes()


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


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Standin:
    path = build_once(tmp_path_factory.mktemp("standin"))
    return Standin(path, DT, API)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> ShimLibrary:
    cache = tmp_path_factory.mktemp("shim")
    return ShimLibrary.load({"ARGUS_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"})


# ---- cupti-python facts the probe relies on ---------------------------------------------------

def test_constants_match_cupti_python():
    assert int(cupti_module.ActivityKind.CONCURRENT_KERNEL) == KIND == 10
    assert int(cupti_module.ActivityKind.RUNTIME) == RUNTIME_KIND
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
    reader = CountingReader()
    rec = records(ROWS)
    cols = decode_kernel_buffer(memoryview(rec.tobytes()), rec.nbytes, reader)
    assert cols.count == len(ROWS) and cols.incomplete == 0 and cols.record_dtype == DT
    assert cols.start_ns.tolist() == [r[0] for r in ROWS]
    assert cols.dur_ns.tolist() == [r[1] - r[0] for r in ROWS]
    assert cols.stream.tolist() == [r[2] for r in ROWS]
    assert [cols.names[i] for i in cols.name] == [read_c_string(r[3]) for r in ROWS]
    assert sorted(cols.names) == sorted(set(cols.names))  # no string twice in a batch
    assert cols.name[0] == cols.name[3] == cols.name[4]  # two pointers, one text, one id
    assert sorted(reader.reads) == sorted({r[3] for r in ROWS})  # once per pointer
    assert cols.name.dtype == np.int32 and cols.other_kinds == {}
    assert all(c.dtype == np.int64 for c in (cols.stream, cols.start_ns, cols.dur_ns))


def test_names_are_read_again_for_every_buffer():
    """A module unload can free a kernel name and reuse its address for another: a pointer
    seen in an earlier buffer is never trusted for a later one."""
    text = ctypes.create_string_buffer(b"first_kernel_name", 64)
    pointer = ctypes.addressof(text)
    rec = records([(10, 20, 7, pointer)])
    reader = CountingReader()
    first = decode_kernel_buffer(rec.tobytes(), rec.nbytes, reader)
    text.value = b"other_kernel_at_same_address"
    second = decode_kernel_buffer(rec.tobytes(), rec.nbytes, reader)
    assert first.names == ["first_kernel_name"]
    assert second.names == ["other_kernel_at_same_address"]
    assert reader.reads == [pointer, pointer]


def test_decode_zero_valid_bytes_yields_nothing():
    cols = decode_kernel_buffer(records(ROWS).tobytes(), 0, CountingReader())
    assert cols.count == 0 and cols.names == [] and len(cols.name) == 0


def test_decode_uses_valid_size_not_the_buffer_length():
    buf = bytearray(4096)
    rec = records(ROWS)
    buf[:rec.nbytes] = rec.tobytes()
    buf[rec.nbytes:rec.nbytes + 4] = (123).to_bytes(4, "little")  # stale bytes past valid
    cols = decode_kernel_buffer(buf, rec.nbytes, read_c_string)
    assert cols.count == len(ROWS)


def test_decode_counts_records_without_timestamps_and_names_null_pointers():
    rows = [*ROWS[:2], (5_000, 0, 7, PTR["relu"]), (0, 0, 7, PTR["relu"]),
            (6_000, 6_100, 9, 0), (7_000, 7_050, 9, PTR["empty"])]
    rec = records(rows)
    cols = decode_kernel_buffer(rec.tobytes(), rec.nbytes, read_c_string)
    assert cols.incomplete == 2 and cols.count == 4
    assert cols.start_ns.tolist() == [1_000_000, 1_000_600, 6_000, 7_000]
    assert [cols.names[i] for i in cols.name][2:] == [UNKNOWN_NAME, UNKNOWN_NAME]
    assert UNKNOWN_NAME in cols.names and len(cols.names) == 3


def test_decode_falls_back_from_a_stale_cached_dtype_and_rejects_unknown_layouts():
    rec = records(ROWS)
    cols = decode_kernel_buffer(rec.tobytes(), rec.nbytes, read_c_string,
                                dtype=OLD, candidates=DTYPES)
    assert cols.record_dtype == DT and cols.count == len(ROWS)
    bad = records(ROWS)
    bad["kind"] = int(cupti_module.ActivityKind.MEMCPY)
    with pytest.raises(UnknownRecordLayoutError):
        decode_kernel_buffer(bad.tobytes(), bad.nbytes, read_c_string)


def test_decoded_columns_do_not_alias_the_buffer():
    buf = bytearray(records(ROWS).tobytes())
    cols = decode_kernel_buffer(buf, len(buf), read_c_string)
    buf[:] = bytes(len(buf))  # CUPTI reuses the buffer
    assert cols.start_ns.tolist() == [r[0] for r in ROWS]


# ---- buffers with other record kinds -------------------------------------------------------------

def mixed_buffer(pattern: str) -> tuple[ctypes.Array, int, list[tuple]]:
    """K = a kernel record (the next of ROWS), R = a RUNTIME record; an 8-aligned buffer."""
    parts, kernels, rows = [], iter(ROWS * 4), []
    for letter in pattern:
        if letter == "K":
            row = next(kernels)
            rows.append(row)
            parts.append(records([row]).tobytes())
        else:
            parts.append(runtime_record())
    raw = b"".join(parts)
    buf = (ctypes.c_uint64 * (len(raw) // 8 + 1))()
    ctypes.memmove(buf, raw, len(raw))
    return buf, len(raw), rows


@pytest.mark.parametrize("pattern", ["KRKKK", "RKKRK", "KKKKR", "RRRRR", "KRRKRRRK" * 3])
@pytest.mark.parametrize("walker", ["shim", "python"])
def test_kernels_survive_other_record_kinds(pattern, walker, standin, shim):
    """One RUNTIME record among kernels used to drop the whole buffer as layout-unknown."""
    buf, valid, rows = mixed_buffer(pattern)
    address = ctypes.addressof(buf)
    library = CuptiLibrary(standin.lib, DTYPES)
    if walker == "shim":
        def index() -> RecordIndex:
            return shim.index_records(library.next_record_address(), address, valid, KIND)
    else:
        def index() -> RecordIndex:
            return library.index_records(address, valid, KIND)
    view = (ctypes.c_char * valid).from_address(address)
    cols = decode_kernel_buffer(view, valid, read_c_string, candidates=DTYPES,
                                index_records=index)
    assert cols.start_ns.tolist() == [r[0] for r in rows]
    assert cols.dur_ns.tolist() == [r[1] - r[0] for r in rows]
    assert [cols.names[i] for i in cols.name] == [read_c_string(r[3]) for r in rows]
    runtime = pattern.count("R")
    assert cols.other_kinds == ({RUNTIME_KIND: runtime} if runtime else {})


def test_walks_agree_and_measure_record_sizes(standin, shim):
    buf, valid, _ = mixed_buffer("KRKRRK")
    address = ctypes.addressof(buf)
    library = CuptiLibrary(standin.lib, DTYPES)
    native = shim.index_records(library.next_record_address(), address, valid, KIND)
    python = library.index_records(address, valid, KIND)
    assert native.offsets.tolist() == python.offsets.tolist() == [
        0, 216 + 40, 2 * 216 + 3 * 40]
    assert native.sizes.tolist() == python.sizes.tolist() == [216, 216, 216]
    assert native.kinds == python.kinds == {KIND: 3, RUNTIME_KIND: 3}


def test_a_kernel_record_size_no_dtype_knows_is_named():
    """A newer CUPTI than cupti-python (e.g. 13.5 with 13.0.1) writes longer kernel records:
    the error says how long, so the probe's state can say what to install."""
    longer = RecordIndex(np.array([0, 264], dtype=np.int64), np.array([224, 224]), {KIND: 2})
    buf = bytes(600)
    buf = bytearray(buf)
    buf[0:4] = buf[264:268] = KIND.to_bytes(4, "little")
    with pytest.raises(UnknownRecordLayoutError) as err:
        decode_kernel_buffer(buf, 600, read_c_string, candidates=DTYPES,
                             index_records=lambda: longer)
    assert err.value.record_size == 224
    assert "224-byte kernel records" in str(err.value) and "216 B" in str(err.value)


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


def test_gathered_records_at_unaligned_offsets_read_right():
    """The walk's offsets are used as they come: fields off their natural alignment are read
    byte-wise, with the same result."""
    rec = records(ROWS[:3])
    buf = bytearray(4) + bytearray(rec.tobytes())  # every record 4 bytes off alignment
    index = RecordIndex(np.array([4, 4 + 216, 4 + 432], dtype=np.int64),
                        np.array([216, 216, 216], dtype=np.int64), {KIND: 3})
    cols = decode_kernel_buffer(buf, len(buf), read_c_string, candidates=DTYPES,
                                index_records=lambda: index)
    assert cols.start_ns.tolist() == [r[0] for r in ROWS[:3]]
    assert cols.stream.tolist() == [r[2] for r in ROWS[:3]]
    assert [cols.names[i] for i in cols.name] == [read_c_string(r[3]) for r in ROWS[:3]]
