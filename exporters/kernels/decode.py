"""Decoding CUPTI activity buffers into ``kernels`` columns, in bulk with numpy (no GPU needed).

A completed buffer normally holds only CONCURRENT_KERNEL records, laid end to end in the struct
version of the running CUPTI: the fast path views it with the cupti-python record dtype whose
itemsize tiles the valid bytes and under which every record's ``kind`` is CONCURRENT_KERNEL
(a strided view, no copy, no per-record Python object).

Activity kinds are process-wide, so another library (or a profiler) that enables other kinds
puts its records into the same buffers. Such a buffer is walked by CUPTI's own
``cuptiActivityGetNextRecord`` (``index_records``, from the native shim or a Python loop): the
kernel records are gathered by their offsets and the others counted by kind, never dropped with
the kernels. The distance between consecutive records also tells the kernel record's real size,
which names the mismatch when cupti-python's dtypes do not fit the loaded CUPTI.

Kernel names are C string pointers. They are read again for every buffer (the few distinct
pointers of a buffer, ~1 us each): a module unload can free a name and reuse its address for
another, so a pointer is never trusted across buffers. Each batch carries the names it uses,
deduplicated by text.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CONCURRENT_KERNEL = 10  # cupti.cupti.ActivityKind.CONCURRENT_KERNEL
RECORD_FIELDS = ("kind", "start", "end", "stream_id", "name")
UNKNOWN_NAME = "<unknown>"  # a NULL or empty name pointer (the schema wants non-empty names)
_KERNEL_DTYPE = re.compile(r"^activity_kernel(\d+)_dtype$")


class UnknownRecordLayoutError(ValueError):
    """Kernel records that no cupti-python record dtype describes.

    ``record_size`` is the kernel record size CUPTI wrote, when a walk could measure it.
    """

    def __init__(self, message: str, record_size: int | None = None):
        super().__init__(message)
        self.record_size = record_size


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

    Records start at offset 0 and follow each other, so any record of another kind starts at a
    multiple of the itemsize and shows there: the check is exact, not a guess.
    """
    if valid_size <= 0 or valid_size > _nbytes(buf):
        return None
    for dtype in candidates:
        size = dtype.itemsize
        if size == 0 or valid_size % size:
            continue
        kinds = np.frombuffer(buf, dtype=dtype, count=valid_size // size)["kind"]
        if bool(np.all(kinds == CONCURRENT_KERNEL)):
            return dtype
    return None


@dataclass(frozen=True)
class RecordIndex:
    """Where a buffer's kernel records are (as ``cuptiActivityGetNextRecord`` walked it).

    ``offsets``/``sizes`` (int64) locate each kernel record; ``kinds`` counts every record of
    the buffer by activity kind, kernels included.
    """

    offsets: np.ndarray
    sizes: np.ndarray
    kinds: dict[int, int]


@dataclass(frozen=True)
class KernelColumns:
    """One decoded buffer: the columns of a ``kernels`` record (``name`` indexes ``names``)."""

    names: list[str]
    name: np.ndarray  # int32
    stream: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    incomplete: int  # kernel records without usable timestamps (start 0 or end < start)
    record_dtype: np.dtype | None  # the dtype that described the records (None when empty)
    other_kinds: dict[int, int] = field(default_factory=dict)  # records of other kinds, by kind

    @property
    def count(self) -> int:
        """Number of kernel executions decoded."""
        return len(self.start_ns)


def _empty_columns(dtype: np.dtype | None, other_kinds: dict[int, int] | None = None,
                   ) -> KernelColumns:
    empty = np.empty(0, dtype=np.int64)
    return KernelColumns([], np.empty(0, dtype=np.int32), empty, empty.copy(), empty.copy(), 0,
                         dtype, other_kinds or {})


def _gather(buf: Any, valid_size: int, index: RecordIndex,
            candidates: Sequence[np.dtype]) -> tuple[np.ndarray, np.dtype]:
    """The indexed kernel records' fields (RECORD_FIELDS only), read at their offsets."""
    sizes = np.unique(index.sizes)
    if len(sizes) != 1:
        raise UnknownRecordLayoutError(
            f"kernel records of several sizes in one buffer ({sizes.tolist()} B)")
    size = int(sizes[0])
    dtype = next((d for d in candidates if d.itemsize == size), None)
    if dtype is None:
        known = ", ".join(f"{d.itemsize} B" for d in candidates) or "none"
        raise UnknownRecordLayoutError(
            f"CUPTI writes {size}-byte kernel records; cupti-python's kernel dtypes are {known}",
            record_size=size)
    out = np.empty(len(index.offsets), dtype=[(f, dtype.fields[f][0]) for f in RECORD_FIELDS])
    raw = np.frombuffer(buf, dtype=np.uint8, count=valid_size)
    for name in RECORD_FIELDS:
        field_dtype, field_offset = dtype.fields[name][:2]
        width = field_dtype.itemsize
        at = index.offsets + field_offset
        if not (at % width).any():  # aligned (CUPTI's records are): one fancy index per field
            out[name] = np.frombuffer(buf, dtype=field_dtype, count=valid_size // width)[
                at // width]
        else:
            out[name] = raw[at[:, None] + np.arange(width)].copy().view(field_dtype)[:, 0]
    return out, dtype


def decode_kernel_buffer(buf: Any, valid_size: int, read_name: Callable[[int], str], *,
                         dtype: np.dtype | None = None,
                         candidates: Sequence[np.dtype] | None = None,
                         index_records: Callable[[], RecordIndex] | None = None,
                         ) -> KernelColumns:
    """Decode a completed CUPTI activity buffer into ``kernels`` columns, all in numpy.

    ``dtype`` (the one that fitted last time) is tried first, then ``candidates`` (by default
    cupti-python's kernel dtypes, newest first). A buffer they do not tile (records of other
    kinds) is walked with ``index_records`` when given. Raises UnknownRecordLayoutError when
    nothing describes the records. The columns are copies: the buffer can go back to CUPTI as
    soon as this returns.
    """
    if valid_size <= 0:
        return _empty_columns(dtype)
    pool = kernel_record_dtypes() if candidates is None else list(candidates)
    chosen = pick_record_dtype(buf, valid_size, [dtype]) if dtype is not None else None
    if chosen is None:
        chosen = pick_record_dtype(buf, valid_size, pool)
    other_kinds: dict[int, int] = {}
    if chosen is not None:
        records = np.frombuffer(buf, dtype=chosen, count=valid_size // chosen.itemsize)
    elif index_records is not None:
        index = index_records()
        other_kinds = {k: n for k, n in index.kinds.items() if k != CONCURRENT_KERNEL and n}
        if len(index.offsets) == 0:
            return _empty_columns(dtype, other_kinds)
        records, chosen = _gather(buf, valid_size, index, [dtype, *pool] if dtype else pool)
    else:
        raise UnknownRecordLayoutError(f"{valid_size} valid bytes match no kernel record dtype "
                                       "with only CONCURRENT_KERNEL records")
    start = records["start"].astype(np.int64)  # uint64 ns; >= 2**63 wraps negative: rejected
    end = records["end"].astype(np.int64)
    pointers = records["name"]
    stream = records["stream_id"]
    usable = (start > 0) & (end >= start)
    incomplete = len(usable) - int(np.count_nonzero(usable))
    if incomplete:
        start, end, pointers, stream = start[usable], end[usable], pointers[usable], stream[usable]
    names, name = _name_columns(pointers, read_name)
    return KernelColumns(names=names, name=name, stream=stream.astype(np.int64), start_ns=start,
                         dur_ns=end - start, incomplete=incomplete, record_dtype=chosen,
                         other_kinds=other_kinds)


def _name_columns(pointers: np.ndarray, read_name: Callable[[int], str],
                  ) -> tuple[list[str], np.ndarray]:
    """(distinct texts, int32 index per record): each distinct pointer read once, now."""
    distinct, per_record = np.unique(pointers, return_inverse=True)
    texts: list[str] = []
    by_text: dict[str, int] = {}
    local = np.empty(len(distinct), dtype=np.int32)
    for i, pointer in enumerate(distinct.tolist()):
        text = _read(pointer, read_name)
        name_id = by_text.get(text)
        if name_id is None:
            name_id = by_text[text] = len(texts)
            texts.append(text)
        local[i] = name_id
    return texts, local[per_record.reshape(-1)]


def _read(pointer: int, read_name: Callable[[int], str]) -> str:
    text = ""
    if pointer:
        try:
            text = read_name(pointer)
        except Exception:  # a pointer we cannot read is a name we do not know
            text = ""
    return text or UNKNOWN_NAME


def read_c_string(pointer: int) -> str:
    """The NUL-terminated string at ``pointer`` (a CUPTI kernel name), UTF-8 decoded."""
    return ctypes.string_at(pointer).decode("utf-8", "replace")
