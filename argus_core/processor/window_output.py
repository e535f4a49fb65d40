"""The writer's side of one window: its duration sketch and its Perfetto file in the making.

Each chunk of kernels handed over by the window store goes straight into two things that do
not grow with the window's length: a :class:`~argus_core.stats.sketch.DurationSketch` per
(kernel, stream) group, which the KDE valley clustering runs on when the window closes, and
the window's gzip Perfetto file on local disk, appended chunk by chunk. Closing the window
writes its steps, phases and stack samples, finishes the file and compresses the sketch into
the kernel summaries served on /metrics. The file then moves into the upload spool.

A ``.part`` file sits next to a ``.key`` file holding its object key. Every chunk ends with a
gzip sync point, so a processor that dies mid-window leaves a file whose prefix still
decompresses to whole chunks: :func:`salvage` turns such leftovers into finished traces.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import uuid
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from argus_core.processor.memory import WINDOW_BYTES
from argus_core.processor.perfetto import GzipWriter, TraceWriter
from argus_core.processor.windows import KernelChunk
from argus_core.stats.grouping import dense_ids
from argus_core.stats.sketch import DurationSketch
from argus_core.summaries import KernelSummary, summarize_sketch

log = logging.getLogger(__name__)

PART_SUFFIX = ".pftrace.gz.part"


class WindowOutput:
    """Absorbs a window's kernel chunks into a duration sketch and a Perfetto file on disk."""

    def __init__(self, directory: Path, key: str, *, job: str, rank: int, window_start_ns: int,
                 window_ns: int, host: str = ""):
        self.key = key
        self.job, self.rank = job, rank
        self.window_index = window_start_ns // window_ns
        self.window_ns = window_ns
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{uuid.uuid4().hex}{PART_SUFFIX}"
        self._key_path = self.path.with_suffix(".key")
        self._key_path.write_text(key, encoding="utf-8")
        self._file = _AppendingFile(self.path)
        self._gzip = GzipWriter(self._file)
        self.trace = TraceWriter(self._gzip.write, job=job, rank=rank,
                                 window_start_ns=window_start_ns, window_ns=window_ns,
                                 host=host)
        self.sketch = DurationSketch()
        self._group_of: dict[tuple[int, int], int] = {}
        self._group_kernel: list[int] = []
        self._group_stream: list[int] = []

    def add(self, names: Sequence[str], chunk: KernelChunk, stacks: Sequence = ()) -> None:
        """Absorb one chunk of kernels (``chunk.name`` indexes ``names``) and stack samples."""
        if stacks:
            self.trace.add_stacks(stacks)
        if len(chunk):
            local, (kernel, stream) = dense_ids(chunk.name.astype(np.int64), chunk.stream)
            lookup = np.array([self._group(k, s) for k, s in
                               zip(kernel.tolist(), stream.tolist(), strict=True)],
                              dtype=np.int64)
            self.sketch.add(lookup[local], chunk.dur_ns, len(self._group_of))
            self.trace.add_kernels(names, chunk.name, chunk.stream, chunk.start_ns,
                                   chunk.dur_ns)
        if stacks or len(chunk):
            self._gzip.sync()
            self._file.spill()

    def memory_bytes(self) -> int:
        """Estimated bytes this window's writer state holds (gzip state, sketch, groups)."""
        sketch = sum(getattr(value, "nbytes", 0) for value in vars(self.sketch).values())
        return WINDOW_BYTES + sketch + 200 * len(self._group_of)

    def _group(self, kernel: int, stream: int) -> int:
        group = self._group_of.get((kernel, stream))
        if group is None:
            group = self._group_of[(kernel, stream)] = len(self._group_of)
            self._group_kernel.append(kernel)
            self._group_stream.append(stream)
        return group

    def finish(self, names: Sequence[str], steps: list, stacks: list) -> KernelSummary:
        """Write steps, phases and stacks, close the file (fsynced) and summarise the kernels."""
        self.trace.finish(names, steps, stacks)
        self._gzip.close()
        self._file.spill(fsync=True)
        groups = len(self._group_of)
        return summarize_sketch(
            self.sketch, np.full(groups, self.rank, dtype=np.int64),
            np.array(self._group_kernel, dtype=np.int64),
            np.array(self._group_stream, dtype=np.int64),
            np.full(groups, self.window_index, dtype=np.int64), list(names), self.window_ns)

    def discard(self) -> None:
        """Drop the file (after it has been handed on, or when the window failed)."""
        self._file.pending.clear()
        for path in (self.path, self._key_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class _AppendingFile:
    """A file written in bursts that holds no descriptor in between: what is written
    collects in memory until :meth:`spill` appends it (open, write, close). Thousands of
    open windows then need no more file descriptors than one."""

    def __init__(self, path: Path):
        self.path = path
        self.pending: list[bytes] = []
        path.write_bytes(b"")

    def write(self, data: bytes) -> None:
        """Collect one piece."""
        self.pending.append(bytes(data))

    def spill(self, fsync: bool = False) -> None:
        """Append what was collected to the file (and fsync it)."""
        with open(self.path, "ab") as out:
            out.writelines(self.pending)
            self.pending.clear()
            if fsync:
                out.flush()
                os.fsync(out.fileno())


def leftovers(directory: Path) -> Iterator[tuple[str, Path, Path]]:
    """(key, part file, key file) of windows a previous processor left unfinished."""
    if not directory.is_dir():
        return
    for part in sorted(directory.glob(f"*{PART_SUFFIX}")):
        key_path = part.with_suffix(".key")
        try:
            key = key_path.read_text(encoding="utf-8")
        except OSError:
            log.warning("unfinished window %s has no key file; deleting it", part)
            part.unlink(missing_ok=True)
            continue
        yield key, part, key_path


def salvage(part: Path) -> bytes | None:
    """The whole packets of an unfinished window file, as a finished gzip trace (or None).

    The file was written with a sync point after every chunk, so its deflate stream
    decompresses up to the last completed chunk; a packet cut off by the crash is dropped.
    """
    data = part.read_bytes()
    try:
        inflated = zlib.decompressobj(31).decompress(data)
    except zlib.error:
        return None
    end = _whole_packets(inflated)
    if end == 0:
        return None
    out = io.BytesIO()
    gz = GzipWriter(out)
    gz.write(inflated[:end])
    gz.close()
    return out.getvalue()


def _whole_packets(data: bytes) -> int:
    """Length of the prefix of a serialized ``Trace`` made of complete ``packet`` fields."""
    pos = 0
    while pos < len(data):
        if data[pos] != 0x0A:  # Trace.packet: field 1, length-delimited
            break
        cursor, length, shift = pos + 1, 0, 0
        while cursor < len(data) and shift < 64:
            byte = data[cursor]
            cursor += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        else:
            break
        if cursor + length > len(data):
            break
        pos = cursor + length
    return pos
