"""Read schema-v1 NDJSON from files, directories, gzip files or stdin into columnar traces.

A bad line is rejected with its source, line number and field, counted, and skipped: the rest
of the input is still read. ``load_traces`` raises ``InputError`` only when nothing usable is
left (no input files, or no valid record at all).
"""

from __future__ import annotations

import gzip
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

from argus_core.schema import SchemaError, parse_record
from argus_core.trace import Trace, TraceBuilder

TRACE_SUFFIXES = (".ndjson", ".jsonl", ".json")
MAX_KEPT_REJECTS = 1000


class InputError(Exception):
    """The input as a whole cannot be diagnosed (nothing to read, or nothing valid in it)."""


@dataclass(frozen=True)
class Reject:
    """One rejected line: where it was and what was wrong with it."""

    source: str
    line: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.field}: {self.reason}"


@dataclass
class LoadResult:
    """Traces per job plus an account of what was skipped and why."""

    traces: dict[str, Trace]
    records: int = 0
    rejects: list[Reject] = field(default_factory=list)
    reject_counts: Counter = field(default_factory=Counter)
    empty_sources: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        """Total number of rejected lines (including those not kept in ``rejects``)."""
        return sum(self.reject_counts.values())


def trace_files(paths: Iterable[str | Path]) -> list[str]:
    """Expand paths into trace sources: files as given, directories recursively, ``-`` = stdin."""
    out: list[str] = []
    for raw in paths:
        if str(raw) == "-":
            out.append("-")
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_trace_name(p.name))
            out.extend(str(p) for p in found)
        elif path.exists():
            out.append(str(path))
        else:
            raise InputError(f"{path}: no such file or directory")
    return out


def _is_trace_name(name: str) -> bool:
    name = name.removesuffix(".gz")
    return name.endswith(TRACE_SUFFIXES)


def _open(source: str) -> BinaryIO:
    if source == "-":
        return sys.stdin.buffer
    handle = open(source, "rb")  # noqa: SIM115 - closed by the caller
    if handle.read(2) == b"\x1f\x8b":
        handle.seek(0)
        return gzip.GzipFile(fileobj=handle)  # type: ignore[return-value]
    handle.seek(0)
    return handle


def iter_lines(source: str) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, raw line) for each non-blank line of a source."""
    stream = _open(source)
    try:
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield number, line
    finally:
        if source != "-":
            stream.close()


def load_traces(paths: Iterable[str | Path],
                progress: Callable[[int], None] | None = None) -> LoadResult:
    """Read every record under ``paths`` into one columnar Trace per job.

    ``progress`` (optional) is called with the number of bytes consumed since the last call.
    """
    sources = trace_files(paths)
    if not sources:
        raise InputError("no trace files found (looked for *.ndjson, *.jsonl, *.json, and .gz)")
    builder = TraceBuilder()
    result = LoadResult(traces={})
    for source in sources:
        seen = 0
        for number, line in iter_lines(source):
            seen += 1
            if progress is not None:
                progress(len(line))
            try:
                builder.add(parse_record(orjson.loads(line)))
                result.records += 1
            except orjson.JSONDecodeError as exc:
                _reject(result, Reject(source, number, "json", f"malformed JSON ({exc})"))
            except SchemaError as exc:
                _reject(result, Reject(source, number, exc.field, exc.message))
        if seen == 0:
            result.empty_sources.append(source)
    result.traces = builder.finish()
    if not result.traces:
        where = ", ".join(sources[:3]) + (" ..." if len(sources) > 3 else "")
        detail = f"; first problem: {result.rejects[0]}" if result.rejects else ""
        raise InputError(f"no valid trace records in {where}{detail}")
    return result


def _reject(result: LoadResult, reject: Reject) -> None:
    result.reject_counts[reject.field.split("[")[0]] += 1
    if len(result.rejects) < MAX_KEPT_REJECTS:
        result.rejects.append(reject)
