"""``argus traces ls|get|open``: find the Perfetto files the processors stored, download one, or
print the links that open one (the same links as the dashboards').

The store is ``--store URL``, else ``$ARGUS_STORE``, else ``file:///var/lib/argus/traces`` (the
processor's own default, so on a processor host both commands work with no option). S3 stores
(``s3://bucket/prefix``) take the endpoint, credentials and region from the usual AWS settings
(``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``). Times (``--since``, ``--at``) are ISO-8601 (``2026-11-29T19:00:00Z``;
no zone means UTC) or an age such as ``2h``, ``30m``, ``1h30m ago``.
"""

from __future__ import annotations

import argparse
import calendar
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from argus_core.timeparse import parse_duration, parse_instant

PERFETTO_HINT = ("open https://ui.perfetto.dev and drag the file in "
                 "(or use its Open trace file button)")


class _UsageError(Exception):
    """A problem the user can fix; printed as ``argus traces CMD: error: ...``, exit status 2."""


def parse_time(text: str, now_ns: int | None = None) -> int:
    """Nanoseconds since the epoch of an ISO-8601 time (UTC if no zone), Unix seconds or ms,
    the store keys' compact form, or an age (``2h``, ``30m ago``)."""
    words = text.strip().lower().split()
    if words and words[-1] == "ago":
        words = words[:-1]
    try:
        age_s = parse_duration("".join(words))
    except ValueError:
        age_s = None
    if age_s is not None:
        now = time.time_ns() if now_ns is None else now_ns
        return (now // 1_000_000_000) * 1_000_000_000 - round(age_s * 1e9)  # whole seconds
    value = text.strip()
    for parse in (_parse_compact, parse_instant):
        try:
            return parse(value)
        except ValueError:
            continue
    raise ValueError(f"not a time: {text!r} (use e.g. 2026-11-29T19:00:00Z, 2h or 30m ago)")


def _parse_compact(value: str) -> int:
    """The key's own form, ``20261129T190000Z``, so a key's label can be pasted back."""
    moment = datetime.strptime(value.removesuffix("Z").removesuffix("z"), "%Y%m%dT%H%M%S")
    return calendar.timegm(moment.timetuple()) * 1_000_000_000


def _time_arg(words: list[str] | str) -> int:
    """argparse type for ``--since``/``--at`` (several words allowed: ``--since 30m ago``)."""
    text = " ".join(words) if isinstance(words, list) else words
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _rank_arg(text: str) -> int:
    """argparse type for ``--rank``: an integer >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"rank must be an integer >= 0, not {text!r}")
    return int(text)


def format_time(ns: int) -> str:
    """A window start for people: ``2026-11-29T19:00:00Z`` (fractions shown only if present)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{fraction:09d}Z" if fraction else f"{text}Z"


def format_size(size: int) -> str:
    """Bytes for people: ``812 B``, ``4.2 KiB``, ``1.3 MiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def register(commands) -> None:
    """Add the subcommand (``traces ls`` and ``traces get``) to the CLI."""
    from argus_core.processor.store import DEFAULT_STORE_URL, STORE_ENV

    p = commands.add_parser("traces", help="list and download stored Perfetto trace files",
                            description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    store_help = (f"trace store: file:///dir or s3://bucket/prefix (default: ${STORE_ENV}, "
                  f"else {DEFAULT_STORE_URL})")

    ls = sub.add_parser("ls", help="list the trace files of a job, oldest first",
                        description="List a job's trace files: job, rank, window start (UTC), "
                                    "size, key; newest last.")
    ls.add_argument("--store", metavar="URL", help=store_help)
    ls.add_argument("--job", required=True, help="job name (as the training job reported it)")
    ls.add_argument("--rank", type=_rank_arg, help="only this rank")
    ls.add_argument("--since", nargs="+", metavar="T",
                    help="only windows starting at or after T: ISO-8601 UTC "
                         "(2026-11-29T19:00:00Z) or an age (2h, 30m ago)")
    ls.set_defaults(run=run_ls)

    get = sub.add_parser("get", help="download one trace file",
                         description="Download one trace file and say how to open it.")
    get.add_argument("--store", metavar="URL", help=store_help)
    get.add_argument("--job", help="job name")
    get.add_argument("--rank", type=_rank_arg, help="rank")
    which = get.add_mutually_exclusive_group()
    which.add_argument("--at", nargs="+", metavar="T",
                       help="the window holding T: the newest one starting at or before T")
    which.add_argument("--latest", action="store_true", help="the newest window (the default)")
    which.add_argument("--key", help="exact object key (as `argus traces ls` prints it)")
    get.add_argument("-o", "--output", metavar="DIR", default=".",
                     help="directory to write into (default: the current directory)")
    get.set_defaults(run=run_get)
    register_open(sub, store_help)


def _open(args: argparse.Namespace):
    """Open the store named by --store / $ARGUS_STORE / the default."""
    from argus_core.processor.store import default_store_url, open_store

    url = args.store or default_store_url()
    try:
        return open_store(url, max_attempts=2)
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc


def _since(args: argparse.Namespace) -> int | None:
    return None if args.since is None else _time_arg(args.since)


def run_ls(args: argparse.Namespace) -> int:
    """``argus traces ls``: print the matching trace files, newest last."""
    return _guard("ls", lambda: _ls(args))


def _ls(args: argparse.Namespace) -> int:
    from argus_core.processor.store import find_traces

    store = _open(args)
    since_ns = _since(args)
    found = find_traces(store, args.job, args.rank, since_ns)
    if not found:
        raise _UsageError(f"no traces of job {args.job!r}{_where(args.rank, since_ns)} "
                          f"in {store.url}")
    rows = [("JOB", "RANK", "WINDOW START (UTC)", "SIZE", "KEY")]
    rows += [(ref.job, str(ref.rank), format_time(ref.window_start_ns), format_size(info.size),
              ref.key) for ref, info in found]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].ljust(widths[2]),
                 row[3].rjust(widths[3]), row[4]]
        print("  ".join(cells))
    print(f"{len(found)} trace file(s) in {store.url}", file=sys.stderr)
    return 0


def _where(rank: int | None, since_ns: int | None) -> str:
    parts = [] if rank is None else [f" rank {rank}"]
    if since_ns is not None:
        parts.append(f" since {format_time(since_ns)}")
    return "".join(parts)


def run_get(args: argparse.Namespace) -> int:
    """``argus traces get``: download one trace file and print where it is and how to open it."""
    return _guard("get", lambda: _get(args))


def _get(args: argparse.Namespace) -> int:
    from argus_core.processor.store import find_traces, parse_key

    store = _open(args)
    if args.key:
        key = args.key
        ref = parse_key(key)
    else:
        if args.job is None or args.rank is None:
            raise _UsageError("say which file: --job J --rank R [--at T | --latest], or --key KEY")
        at_ns = None if args.at is None else _time_arg(args.at)
        found = find_traces(store, args.job, args.rank)
        if at_ns is not None:
            found = [pair for pair in found if pair[0].window_start_ns <= at_ns]
        if not found:
            when = "" if at_ns is None else f" at or before {format_time(at_ns)}"
            raise _UsageError(f"no traces of job {args.job!r} rank {args.rank}{when} "
                              f"in {store.url}")
        ref = found[-1][0]
        key = ref.key
        print(f"window starting {format_time(ref.window_start_ns)} (UTC): {key}",
              file=sys.stderr)
    data = store.get(key)
    if ref is not None:  # job segment (already file-name safe), rank and window start
        segment, _, label = key.split("/")[-3:]
        name = f"{segment}.rank{ref.rank}.{label}"
    else:
        name = key.rsplit("/", 1)[-1] or "trace.pftrace.gz"
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_bytes(data)
    print(path)
    print(PERFETTO_HINT)
    return 0


def _guard(action: str, body) -> int:
    """Run a subcommand body; user-fixable problems and store errors exit 2 with one line."""
    from argus_core.processor.store import StoreError

    try:
        return body()
    except (_UsageError, StoreError, ValueError, argparse.ArgumentTypeError) as exc:
        print(f"argus traces {action}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in ("boto3", "botocore"):
            raise
        print(f"argus traces {action}: error: s3:// stores need boto3; install the 'service' "
              f"extra (pip install '.[service]' in a checkout) or pip install boto3",
              file=sys.stderr)
        return 2


# -- argus traces open ----------------------------------------------------------------------------
def register_open(sub, store_help: str) -> None:
    """Add ``traces open``: the two links of a rank's window at a time."""
    p = sub.add_parser("open", help="print the links that open a rank's trace at a time",
                       description="Print two URLs for the window of --job/--rank holding "
                                   "--at: the trace file (a presigned S3 URL, or the "
                                   "processor's link) and the Perfetto UI opening it.")
    p.add_argument("--store", metavar="URL", help=store_help)
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--rank", required=True, type=_rank_arg, help="rank")
    p.add_argument("--at", required=True, nargs="+", metavar="T",
                   help="a time inside the window: ISO-8601 UTC, Unix ms, or an age (5m ago)")
    p.add_argument("--processor", metavar="URL",
                   help="link through this processor's /v1/traces routes (needed for a "
                        "file:// store, whose files browsers cannot fetch directly)")
    p.add_argument("--expires", type=int, default=900, metavar="S",
                   help="lifetime of a presigned S3 URL in seconds (default 900)")
    p.set_defaults(run=run_open)


def run_open(args: argparse.Namespace) -> int:
    """``argus traces open``: print the trace URL and the Perfetto UI URL, one per line."""
    return _guard("open", lambda: _open_links(args))


def _open_links(args: argparse.Namespace) -> int:
    from urllib.parse import urlencode

    from argus_core.processor import links

    if not 1 <= args.expires <= links.MAX_EXPIRES_S:
        raise _UsageError(f"--expires {args.expires}: seconds, 1 to {links.MAX_EXPIRES_S} "
                          f"(S3's limit)")
    text = " ".join(args.at)
    try:
        at_ns = links.parse_at(text)
    except links.LinkError:
        at_ns = _time_arg(text)  # an age such as "5m ago"
    store = _open(args)
    try:
        ref = links.find_window(store, args.job, args.rank, at_ns)
    except links.LinkError as exc:
        raise _UsageError(exc.message) from None
    print(f"window starting {format_time(ref.window_start_ns)} (UTC): {ref.key}",
          file=sys.stderr)
    if args.processor:
        base = args.processor.rstrip("/")
        query = urlencode({"job": args.job, "rank": args.rank, "at": format_time(at_ns)})
        print(f"{base}/v1/traces/open?{query}")
        print(f"{base}/v1/traces/perfetto?{query}")
        return 0
    url = links.presigned_url(store, ref.key, args.expires)
    if url is None:
        path = Path(store.root, *ref.key.split("/"))  # a file store
        print(path.absolute().as_uri())
        print(f"{PERFETTO_HINT}; or pass --processor URL for a link "
              f"(e.g. --processor http://127.0.0.1:9700)", file=sys.stderr)
        return 0
    print(url)
    print(links.perfetto_ui_url(url))
    return 0
