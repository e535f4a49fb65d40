"""What crosses the wire around Vector, modelled from Vector's source and documentation.

``decode_http_server`` is what the ``http_server`` source makes of a request: Content-Encoding
undone (gzip, deflate, zstd; a list is undone last-first), the body framed (``bytes``,
``newline_delimited``), each frame decoded as JSON (an empty frame is skipped, an array is
split into one event per item, anything but an object fails) and any failure refusing the
whole request with 400. ``encode_http_sink`` is what the ``http`` sink sends for a batch: each
event serialised as JSON with sorted keys (Vector's maps are ordered), newline-delimited without
a trailing newline (or one ``[...]`` array for the json codec's default framing), compressed,
with the content type, encoding and auth headers Vector derives from those settings, and one
request per rendered URI when ``uri`` is a template.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import zlib
from dataclasses import dataclass

import orjson

from . import vrl


class HttpError(Exception):
    """The status and message an ``http_server`` source answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _undo_encoding(body: bytes, header: str | None) -> bytes:
    for encoding in reversed([e.strip().lower() for e in (header or "").split(",") if e.strip()]):
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding == "zstd":
            from backports import zstd

            body = zstd.decompress(body)
        elif encoding != "identity":
            raise HttpError(415, f"Unsupported encoding {encoding}")
    return body


def _json_int(text: str) -> int | float:
    """serde_json reads integers beyond i64 as floats (Vector's Value has no u64)."""
    value = int(text)
    return value if -(2**63) <= value < 2**63 else float(value)


def _frames(body: bytes, framing: dict) -> list[bytes]:
    method = framing.get("method", "bytes")
    if method == "bytes":
        return [body]
    if method == "newline_delimited":
        return body.split(b"\n")
    if method == "character_delimited":
        return body.split(framing["character_delimited"]["delimiter"].encode())
    raise ValueError(f"framing {method!r} is not modelled")


def check_auth(source: dict, headers: dict[str, str], path: str, address: str = "127.0.0.1"):
    """Apply the source's ``auth`` to a request; HttpError(401) when refused."""
    auth = source.get("auth")
    if not auth:
        return
    lower = {k.lower(): v for k, v in headers.items()}
    if auth.get("strategy", "basic") == "basic":
        expected = "Basic " + base64.b64encode(
            f"{auth['username']}:{auth['password']}".encode()).decode()
        if lower.get("authorization") != expected:
            raise HttpError(401, "Invalid username/password")
        return
    ok, _ = vrl.condition(auth["source"], {"headers": lower, "address": address, "path": path})
    if not ok:
        raise HttpError(401, "Auth failed")


def decode_http_server(source: dict, body: bytes, headers: dict[str, str],
                       path: str) -> list[dict]:
    """The events an ``http_server`` source configured as ``source`` emits for one request."""
    if source.get("decoding", {}).get("codec") != "json":
        raise ValueError("only decoding.codec json is modelled")
    if not source.get("log_namespace"):
        raise ValueError("only log_namespace: true is modelled (legacy adds timestamp etc.)")
    wanted = source.get("path", "/")
    if (path != wanted) if source.get("strict_path", True) else not path.startswith(wanted):
        raise HttpError(404, "Not found")
    check_auth(source, headers, path)
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        data = _undo_encoding(body, lower.get("content-encoding"))
    except (OSError, EOFError, zlib.error) as exc:
        raise HttpError(400, f"Failed decompressing payload: {exc}") from None
    events = []
    for frame in _frames(data, source.get("framing", {})):
        if not frame:
            continue
        try:
            value = json.loads(frame, parse_int=_json_int)
        except ValueError as exc:
            raise HttpError(400, f"Failed decoding body: Error parsing JSON: {exc}") from None
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                raise HttpError(400, "Failed decoding body: Attempted to convert non-Object "
                                     "JSON into an Event.")
            events.append(item)
    return events


_CONTENT_TYPES = {("json", "newline_delimited"): "application/x-ndjson",
                  ("json", "character_delimited"): "application/json"}
_TEMPLATE = re.compile(r"\{\{\s*([^}]+?)\s*\}\}")


@dataclass(frozen=True)
class Request:
    """One request of an ``http`` sink."""

    uri: str
    body: bytes
    headers: dict[str, str]


def _apply_transformer(event: dict, encoding: dict) -> dict:
    event = dict(event)
    if encoding.get("only_fields"):
        event = {k: v for k, v in event.items() if k in encoding["only_fields"]}
    for name in encoding.get("except_fields") or ():
        event.pop(name.lstrip("."), None)
    return event


def render_template(template: str, event: dict) -> str:
    """A Vector template (``{{ field }}``, top-level fields only here); KeyError if missing."""
    def field(match: re.Match) -> str:
        value = event[match.group(1).lstrip(".")]
        return value if isinstance(value, str) else json.dumps(value)

    return _TEMPLATE.sub(field, template)


def encode_http_sink(sink: dict, events: list[dict]) -> list[Request]:
    """The requests an ``http`` sink configured as ``sink`` sends for one batch of events."""
    encoding = sink["encoding"]
    codec = encoding["codec"]
    if codec != "json":
        raise ValueError("only encoding.codec json is modelled")
    framing = (sink.get("framing") or {}).get("method", "character_delimited")
    by_uri: dict[str, list[dict]] = {}
    for event in events:
        by_uri.setdefault(render_template(sink["uri"], event), []).append(event)
    compression = sink.get("compression", "none")
    compression = compression.get("algorithm") if isinstance(compression, dict) else compression
    headers = {"Content-Type": _CONTENT_TYPES[codec, framing]}
    if compression == "gzip":
        headers["Content-Encoding"] = "gzip"
    elif compression != "none":
        raise ValueError(f"compression {compression!r} is not modelled")
    auth = sink.get("auth") or {}
    if auth.get("strategy") == "bearer":
        headers["Authorization"] = f"Bearer {auth['token']}"
    elif auth.get("strategy") == "basic":
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{auth['user']}:{auth.get('password', '')}".encode()).decode()
    headers.update((sink.get("request") or {}).get("headers") or {})
    requests = []
    for uri, batch in by_uri.items():
        lines = [orjson.dumps(_apply_transformer(e, encoding), option=orjson.OPT_SORT_KEYS)
                 for e in batch]
        if framing == "newline_delimited":
            body = b"\n".join(lines)  # Vector drops the last newline
        else:
            body = b"[" + b",".join(lines) + b"]"
        if compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        requests.append(Request(uri, body, dict(headers)))
    return requests
