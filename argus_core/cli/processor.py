"""``argus processor``: run the per-host trace-path service."""

from __future__ import annotations

import argparse
import os
import sys

from argus_core.processor.config import DURABILITY, ProcessorConfig

_DEFAULTS = ProcessorConfig()
DEFAULT_TOKEN_ENV = "ARGUS_PROCESSOR_TOKEN"


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "processor", help="run the per-host processor (ingest, windows, Perfetto, /metrics)",
        description="Serve POST /v1/records (schema v1, as Vector's http sink sends it), "
                    "compress kernels per window into /metrics summaries and write one "
                    "Perfetto file per rank and window to the trace store. A 2xx means the "
                    "records are in the write-ahead log on disk.")
    p.add_argument("--listen", default="127.0.0.1:9700", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:9700: loopback only)")
    p.add_argument("--store", default=os.environ.get("ARGUS_STORE",
                                                     "file:///var/lib/argus/traces"),
                   help="file:///dir or s3://bucket/prefix (default $ARGUS_STORE or "
                        "file:///var/lib/argus/traces)")
    p.add_argument("--spool", default="/var/lib/argus/spool", metavar="DIR",
                   help="state directory that survives restarts: the upload spool, windows "
                        "being written (windows/) and the write-ahead log (wal/)")
    p.add_argument("--spool-max-mb", type=int, default=None,
                   help="upload spool cap (default 4096 MB); past 90%% of it intake answers "
                        "503, beyond it files are dropped and counted")
    p.add_argument("--window", type=float, default=_DEFAULTS.window_s, metavar="SECONDS",
                   help="record time per window, file and summary (default 60)")
    p.add_argument("--grace", type=float, default=_DEFAULTS.grace_s, metavar="SECONDS",
                   help="how long a window waits for late records (default 10)")
    p.add_argument("--max-body-mb", type=int, default=_DEFAULTS.max_body_bytes >> 20,
                   help="decompressed body limit (default 64)")
    p.add_argument("--max-skew", type=float, default=_DEFAULTS.max_skew_s, metavar="SECONDS",
                   help="refuse records stamped further ahead of this host's clock "
                        "(default 300)")
    p.add_argument("--max-age", type=float, default=_DEFAULTS.max_age_s, metavar="SECONDS",
                   help="refuse records older than this (default 86400: one day)")
    p.add_argument("--memory-budget-mb", type=int,
                   default=_DEFAULTS.memory_budget_bytes >> 20,
                   help="everything held in memory, every kind of record (default 512); past "
                        "it intake answers 503")
    p.add_argument("--durability", choices=DURABILITY, default=_DEFAULTS.durability,
                   help="what a 2xx waits for: 'write' (default: the records are written to "
                        "the log; a process crash loses nothing), 'fsync' (also fsynced: a "
                        "machine crash loses nothing), 'memory' (no log)")
    p.add_argument("--wal-sync-interval", type=float, default=_DEFAULTS.wal_sync_interval_s,
                   metavar="SECONDS", help="with --durability write, fsync the log this often")
    p.add_argument("--wal-max-mb", type=int, default=_DEFAULTS.wal_max_bytes >> 20,
                   help="write-ahead log on disk beyond which intake answers 503 "
                        "(default 8192)")
    p.add_argument("--chunk-events", type=int, default=_DEFAULTS.chunk_events,
                   help="a window's kernels are appended to its file and sketch in chunks "
                        "of this many (default 65,536)")
    p.add_argument("--state-ttl", type=float, default=_DEFAULTS.state_ttl_s,
                   metavar="SECONDS",
                   help="forget a rank's identity, state and /metrics summaries this long "
                        "after its last record (default 3600)")
    p.add_argument("--max-ranks", type=int, default=_DEFAULTS.max_ranks,
                   help="(job, rank) pairs remembered at most; the least recently seen go "
                        "first (default 65,536)")
    p.add_argument("--max-windows-per-rank", type=int, default=_DEFAULTS.max_windows_per_rank,
                   help="windows a rank keeps open at once; beyond, its oldest closes early "
                        f"(default {_DEFAULTS.max_windows_per_rank})")
    p.add_argument("--max-body-windows", type=int, default=_DEFAULTS.max_body_windows,
                   help="windows one body may open; a body that would open more is refused "
                        f"with 413 (default {_DEFAULTS.max_body_windows:,})")
    p.add_argument("--max-metrics-series", type=int, default=_DEFAULTS.max_metrics_series,
                   help="kernel summary series on /metrics; the ranks beyond are left out and "
                        f"counted (default {_DEFAULTS.max_metrics_series:,})")
    p.add_argument("--max-connections", type=int, default=_DEFAULTS.max_connections,
                   help="client connections at most (default 1024); a new one beyond it "
                        "evicts the one stalled longest")
    p.add_argument("--read-timeout", type=float, default=_DEFAULTS.read_timeout_s,
                   metavar="SECONDS",
                   help="longest wait for the next bytes of a request body (default 10)")
    p.add_argument("--idle-timeout", type=float, default=_DEFAULTS.idle_timeout_s,
                   metavar="SECONDS",
                   help="a connection's request headers must arrive within this (default 30)")
    p.add_argument("--top-k", type=int, default=_DEFAULTS.top_k,
                   help="kernels per rank on /metrics, those with the most time (default "
                        f"{_DEFAULTS.top_k})")
    p.add_argument("--token-env", default=None, metavar="VAR",
                   help="environment variable holding the bearer token of POST /v1/records "
                        f"(default {DEFAULT_TOKEN_ENV}; unset: no auth, allowed on loopback "
                        "only). A variable named here must be set")
    p.add_argument("--read-token-env", default=None, metavar="VAR",
                   help="environment variable holding a bearer token that trace reads "
                        "(/v1/traces/*) need; it must be set (default: reads need no token)")
    p.add_argument("--protect-reads", action="store_true",
                   help="trace reads need the ingest token (when no --read-token-env)")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --listen address without a token")
    p.set_defaults(run=run)


def _token(variable: str | None, default: str | None) -> str | None:
    """The token in ``variable`` (a variable named on the command line must be set), else
    in ``default`` if that is set."""
    if variable is not None:
        value = os.environ.get(variable, "").strip()
        if not value:
            raise ValueError(f"${variable} (named by a token option) is unset or empty: "
                             f"refusing to start without the token it should hold")
        return value
    return (os.environ.get(default, "").strip() or None) if default else None


def run(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT."""
    from argus_core.cli.listen import host_port
    from argus_core.processor.service import serve

    try:
        host, port = host_port(args.listen)
    except ValueError as exc:
        print(f"argus processor: error: {exc}", file=sys.stderr)
        return 2
    try:
        token = _token(args.token_env, DEFAULT_TOKEN_ENV)
        read_token = _token(args.read_token_env, None) or (token if args.protect_reads
                                                           else None)
    except ValueError as exc:
        print(f"argus processor: error: {exc}", file=sys.stderr)
        return 2
    if args.protect_reads and not read_token:
        print("argus processor: error: --protect-reads needs an ingest token "
              f"(${args.token_env or DEFAULT_TOKEN_ENV} is unset)", file=sys.stderr)
        return 2
    config = ProcessorConfig(
        host=host, port=port, store=args.store, spool_dir=args.spool,
        max_spool_bytes=(args.spool_max_mb << 20 if args.spool_max_mb is not None
                         else ProcessorConfig.max_spool_bytes),
        token=token, read_token=read_token, insecure=args.insecure,
        window_s=args.window, grace_s=args.grace, max_body_bytes=args.max_body_mb << 20,
        max_skew_s=args.max_skew, max_age_s=args.max_age,
        memory_budget_bytes=args.memory_budget_mb << 20, durability=args.durability,
        wal_sync_interval_s=args.wal_sync_interval, wal_max_bytes=args.wal_max_mb << 20,
        chunk_events=args.chunk_events, state_ttl_s=args.state_ttl, max_ranks=args.max_ranks,
        max_windows_per_rank=args.max_windows_per_rank,
        max_body_windows=args.max_body_windows, max_metrics_series=args.max_metrics_series,
        max_connections=args.max_connections, read_timeout_s=args.read_timeout,
        idle_timeout_s=args.idle_timeout, top_k=args.top_k)
    try:
        serve(config)
    except ValueError as exc:  # a bad store URL or setting
        print(f"argus processor: error: {exc}", file=sys.stderr)
        return 2
    return 0
