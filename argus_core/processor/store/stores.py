"""Trace stores: the ``TraceStore`` protocol, a local directory (``file://``) and S3
(``s3://``), opening one from its URL, and finding a job's traces in one."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from argus_core.processor.store.keys import (
    DEFAULT_STORE_URL,
    MAX_WINDOW_NS,
    S3_CONNECT_TIMEOUT_S,
    S3_READ_TIMEOUT_S,
    STORE_ENV,
    NotFoundError,
    ObjectInfo,
    StoreError,
    TraceRef,
    job_prefix,
    parse_key,
    window_label,
)

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"  # files being written (renamed into place when complete)


@runtime_checkable
class TraceStore(Protocol):
    """Where trace files live; keys are full object keys, ``prefix`` starts every trace key."""

    prefix: str
    url: str

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (replacing it); raises StoreError on failure."""
        ...

    def put_file(self, key: str, path: Path) -> None:
        """Store the file at ``path`` under ``key``, streaming it (never whole in memory)."""
        ...

    def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix`` (and sorts after ``start_after``), by key."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes stored under ``key``; NotFoundError if absent, StoreError on failure."""
        ...

    def check(self) -> None:
        """Raise StoreError saying why the store cannot take files (missing bucket, denied)."""
        ...


class FileStore:
    """A local directory as a store: key ``a/b/c`` is the file ``{root}/a/b/c``."""

    def __init__(self, root: str | Path, prefix: str = ""):
        self.root = Path(root)
        self.prefix = prefix.strip("/")
        self.url = self.root.absolute().as_uri()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
            raise ValueError(f"invalid key {key!r}: empty, '.' or '..' segments are not allowed")
        return self.root.joinpath(*parts)

    def put(self, key: str, data: bytes) -> None:
        """Write the file through a temporary name and rename, so readers never see half a file."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}") from exc

    def put_file(self, key: str, path: Path) -> None:
        """Copy a file in through a temporary name and rename."""
        target = self._path(key)
        with open(path, "rb") as source:  # a missing source is the caller's, not the store's
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(target, source)
            except OSError as exc:
                raise StoreError(f"cannot write {target}: {exc}") from exc

    def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """Walk only the directory the prefix names, skipping temporary (dot) files."""
        base_dir = prefix.rpartition("/")[0]
        top = self._path(base_dir) if base_dir else self.root
        found: list[ObjectInfo] = []
        try:
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel_dir = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    if name.startswith("."):
                        continue
                    key = name if rel_dir == "." else f"{rel_dir}/{name}"
                    if not key.startswith(prefix) or key <= start_after:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(os.path.join(dirpath, name))
                        found.append(ObjectInfo(key, st.st_size,
                                                datetime.fromtimestamp(st.st_mtime, UTC)))
        except OSError as exc:
            raise StoreError(f"cannot list {top}: {exc}") from exc
        return sorted(found, key=lambda info: info.key)

    def check(self) -> None:
        """The root directory exists (or can be made) and is writable."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.root}: {exc}") from exc
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreError(f"{self.root} is not writable")

    def get(self, key: str) -> bytes:
        """Read the whole file."""
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFoundError(f"no such trace: {key} (in {self.url})") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc

    def open_stream(self, key: str) -> tuple[BinaryIO, int]:
        """The file opened for reading, and its size: a caller streams it in chunks instead of
        holding it whole (the caller closes it). NotFoundError if absent."""
        path = self._path(key)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - returned open, the caller closes it
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise NotFoundError(f"no such trace: {key} (in {self.url})") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        try:
            return handle, os.fstat(handle.fileno()).st_size
        except OSError as exc:
            handle.close()
            raise StoreError(f"cannot read {path}: {exc}") from exc


class S3Store:
    """An S3 bucket through boto3; endpoint, credentials and region come from the AWS settings.

    Timeouts are short (connect 3 s, read 10 s) and botocore's own retries are off by default
    (``max_attempts=1``): the :class:`Uploader` retries with its own backoff and spool, and the
    CLI fails fast. With ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3`` set (MinIO, Ceph, moto),
    path-style addressing is used; ``ARGUS_S3_ADDRESSING_STYLE`` (auto|path|virtual) overrides.
    """

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 max_attempts: int = 1, connect_timeout_s: float = S3_CONNECT_TIMEOUT_S,
                 read_timeout_s: float = S3_READ_TIMEOUT_S):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client if client is not None else _s3_client(
            max_attempts, connect_timeout_s, read_timeout_s)

    def _fail(self, action: str, key: str, exc: Exception, *, of_key: bool = True) -> StoreError:
        """Turn a botocore exception into a StoreError with a message people can act on."""
        from botocore.exceptions import ClientError, NoCredentialsError

        where = f"s3://{self.bucket}/{key}" if key else self.url
        if isinstance(exc, NoCredentialsError):
            return StoreError(f"cannot {action} {where}: no AWS credentials (set "
                              "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = error.get("Code", "?")
            if code in ("NoSuchKey", "404") and of_key:
                return NotFoundError(f"no such trace: {where}")
            if code == "NoSuchBucket":
                return StoreError(f"cannot {action} {where}: bucket {self.bucket!r} does not exist")
            return StoreError(f"cannot {action} {where}: {code}: {error.get('Message', exc)}")
        endpoint = getattr(self._client.meta, "endpoint_url", "?")
        return StoreError(f"cannot {action} {where} (endpoint {endpoint}): {exc}")

    def put(self, key: str, data: bytes) -> None:
        """One ``put_object``; any failure raises StoreError (the caller decides to retry)."""
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data,
                                    ContentType=_content_type(key))
        except Exception as exc:  # botocore raises many unrelated types
            raise self._fail("write", key, exc) from exc

    def put_file(self, key: str, path: Path) -> None:
        """One ``put_object`` whose body is streamed from the file."""
        with open(path, "rb") as body:  # a missing source is the caller's, not the store's
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=body,
                                        ContentType=_content_type(key))
            except Exception as exc:
                raise self._fail("write", key, exc) from exc

    def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """``list_objects_v2`` over all pages; ``start_after`` skips keys server-side."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = start_after
        found: list[ObjectInfo] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                for item in page.get("Contents", ()):
                    modified = item["LastModified"]
                    found.append(ObjectInfo(item["Key"], int(item["Size"]),
                                            modified.astimezone(UTC)))
        except Exception as exc:
            raise self._fail("list", prefix, exc, of_key=False) from exc
        return found

    def check(self) -> None:
        """``head_bucket``: the bucket exists and these credentials may use it."""
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            if code in ("404", "NoSuchBucket"):
                raise StoreError(f"bucket {self.bucket!r} does not exist") from exc
            if code in ("403", "AccessDenied"):
                raise StoreError(f"access to bucket {self.bucket!r} denied") from exc
            raise self._fail("reach", "", exc, of_key=False) from exc
        except Exception as exc:
            raise self._fail("reach", "", exc, of_key=False) from exc

    def get(self, key: str) -> bytes:
        """``get_object`` and read the body."""
        try:
            return self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            raise self._fail("read", key, exc) from exc

    def open_stream(self, key: str) -> tuple[BinaryIO, int]:
        """``get_object``'s streaming body and its length: a caller reads it in chunks instead
        of holding it whole (and closes it, which frees the connection)."""
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            raise self._fail("read", key, exc) from exc
        return answer["Body"], int(answer["ContentLength"])

    def presigned_url(self, key: str, expires_s: int) -> str:
        """A URL that GETs ``key`` without credentials for ``expires_s`` seconds (signed here,
        no request is made: the key's existence is the caller's to check)."""
        try:
            return self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_s)
        except Exception as exc:
            raise self._fail("sign", key, exc) from exc


def _content_type(key: str) -> str:
    return "application/gzip" if key.endswith(".gz") else "application/octet-stream"


def _s3_client(max_attempts: int, connect_timeout_s: float, read_timeout_s: float) -> Any:
    """A boto3 S3 client with short timeouts and our retry policy, from the AWS settings."""
    import boto3
    from botocore.config import Config

    style = os.environ.get("ARGUS_S3_ADDRESSING_STYLE")
    if not style:
        custom = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        style = "path" if custom else "auto"
    if style not in ("auto", "path", "virtual"):
        raise ValueError(f"ARGUS_S3_ADDRESSING_STYLE must be auto, path or virtual, not {style!r}")
    config = Config(connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
                    retries={"total_max_attempts": max_attempts, "mode": "standard"},
                    s3={"addressing_style": style},
                    signature_version="s3v4")  # presigned URLs too (SigV2 is deprecated)
    return boto3.session.Session().client("s3", config=config)


def open_store(url: str, *, max_attempts: int = 1) -> TraceStore:
    """Open ``file:///dir`` or ``s3://bucket[/prefix]``; ValueError for anything else."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"bad store URL {url!r}: a directory is file:///absolute/path")
        return FileStore(unquote(parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"bad store URL {url!r}: expected s3://bucket[/prefix]")
        return S3Store(parsed.netloc, unquote(parsed.path), max_attempts=max_attempts)
    hint = f"; for a directory use file://{os.path.abspath(url)}" if not parsed.scheme else ""
    raise ValueError(f"unsupported store URL {url!r}: use file:///dir or s3://bucket/prefix{hint}")


def default_store_url() -> str:
    """The store URL from ``ARGUS_STORE``, else :data:`DEFAULT_STORE_URL`."""
    return os.environ.get(STORE_ENV) or DEFAULT_STORE_URL


def find_traces(store: TraceStore, job: str, rank: int | None = None,
                since_ns: int | None = None) -> list[tuple[TraceRef, ObjectInfo]]:
    """Trace files of a job (one rank or all) whose window starts at or after ``since_ns``.

    Sorted oldest first (then by rank). With a rank, ``since`` becomes a server-side
    ``StartAfter``, so old windows are never listed.
    """
    prefix = job_prefix(store.prefix, job, rank)
    start_after = ""
    if since_ns is not None and rank is not None and since_ns > 0:
        # The label without its 'Z' sorts before every key of that second and after all earlier.
        start_after = prefix + window_label(min(since_ns, MAX_WINDOW_NS - 1)).split(".")[0][:15]
    found = []
    for info in store.list(prefix, start_after=start_after):
        ref = parse_key(info.key)
        if ref is None or (since_ns is not None and ref.window_start_ns < since_ns):
            continue
        found.append((ref, info))
    found.sort(key=lambda pair: (pair[0].window_start_ns, pair[0].rank, pair[0].key))
    return found

def write_atomic(path: Path, data: bytes | BinaryIO) -> None:
    """Write a temporary file next to ``path``, fsync it, and rename it into place.

    ``data`` is bytes, or a binary file object copied in pieces.
    """
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{random.getrandbits(32):08x}")
    try:
        with open(tmp, "wb") as fh:
            if isinstance(data, bytes | bytearray | memoryview):
                fh.write(data)
            else:
                shutil.copyfileobj(data, fh, 1 << 20)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
