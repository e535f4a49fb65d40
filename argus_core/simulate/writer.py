"""Write simulated records as the exporters' file sink would: one NDJSON file per rank."""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import orjson

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def write_records(records: Iterable[tuple[int, dict]], directory: str | Path,
                  compress: bool = False) -> list[Path]:
    """Write (rank, record) pairs to ``directory/rank-NNNNN.ndjson[.gz]``; return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    chunks: dict[int, list[bytes]] = defaultdict(list)
    for rank, record in records:
        chunks[rank].append(orjson.dumps(record, option=_OPTIONS))
    paths = []
    for rank in sorted(chunks):
        path = directory / f"rank-{rank:05d}.ndjson{'.gz' if compress else ''}"
        data = b"".join(chunks[rank])
        path.write_bytes(gzip.compress(data, compresslevel=3) if compress else data)
        paths.append(path)
    return paths
