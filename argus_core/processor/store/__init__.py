"""Trace storage: object keys, file and S3 stores, and a non-blocking uploader with a disk spool.

The processor writes one gzip-compressed Perfetto file per (job, rank, window) and hands it to
an :class:`Uploader`, which never blocks: the file goes into a bounded spool directory that *is*
the upload queue, and a background thread moves it to the store (retrying with capped
exponential backoff), so nothing accepted into the spool is lost to an S3 outage or a restart.

Key layout (the contract with ``argus traces`` and anyone browsing the bucket)::

    {prefix}/{safe_job(job)}/rank={rank}/{YYYYMMDDTHHMMSSZ}.pftrace.gz

- ``window_start`` is the window's start in UTC, compact ISO-8601 basic format
  (``20261129T190000Z``): readable, fixed-width, and lexicographic order is time order, so
  S3 ``StartAfter`` can skip everything before ``--since``. A start that is not a whole second
  (the processor's windows are whole seconds) gets a nine-digit fraction:
  ``20261129T190000.250000000Z``; :func:`parse_key` reads both forms back to the exact ns.
- ``safe_job``: ASCII letters, digits, ``_``, ``-`` and ``.`` stay; every other character
  (``/``, ``%``, spaces, control characters, non-ASCII) becomes ``%XX`` per UTF-8 byte, as in
  URLs. A ``.`` is also encoded when it starts the name or follows another ``.``, so the
  segment is never ``.``/``..``, never hidden and never contains ``..``. The encoding is
  reversible. Names whose encoding is longer than 128 characters are cut and end in ``~``
  plus 16 hex digits of the name's SHA-256 (``~`` never appears otherwise), which keeps keys
  and file names short; such a job is found by its name (``argus traces ls --job``) but
  :func:`parse_key` reports the segment, not the original name.
"""

from __future__ import annotations

from argus_core.processor.store.keys import (
    DEFAULT_STORE_URL,
    MAX_JOB_SEGMENT,
    MAX_WINDOW_NS,
    S3_CONNECT_TIMEOUT_S,
    S3_READ_TIMEOUT_S,
    STORE_ENV,
    SUFFIX,
    NotFoundError,
    ObjectInfo,
    StoreError,
    TraceRef,
    job_prefix,
    parse_key,
    safe_job,
    trace_key,
    window_label,
)
from argus_core.processor.store.stores import (
    FileStore,
    S3Store,
    TraceStore,
    default_store_url,
    find_traces,
    open_store,
    write_atomic,
)
from argus_core.processor.store.uploads import (
    Uploader,
    UploadStats,
    iter_spool_keys,
)

__all__ = [
    "DEFAULT_STORE_URL",
    "MAX_JOB_SEGMENT",
    "MAX_WINDOW_NS",
    "S3_CONNECT_TIMEOUT_S",
    "S3_READ_TIMEOUT_S",
    "STORE_ENV",
    "SUFFIX",
    "FileStore",
    "NotFoundError",
    "ObjectInfo",
    "S3Store",
    "StoreError",
    "TraceRef",
    "TraceStore",
    "UploadStats",
    "Uploader",
    "default_store_url",
    "find_traces",
    "iter_spool_keys",
    "job_prefix",
    "open_store",
    "parse_key",
    "safe_job",
    "trace_key",
    "window_label",
    "write_atomic",
]
