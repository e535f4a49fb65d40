"""``argus processor``: run the per-host trace-path service."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "processor", help="run the per-host processor (ingest, windows, Perfetto, /metrics)",
        description="Serve POST /v1/records (schema v1, as Vector's http sink sends it), "
                    "compress kernels per window into /metrics summaries and write one "
                    "Perfetto file per rank and window to the trace store.")
    p.add_argument("--listen", default="127.0.0.1:9700", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:9700: loopback only)")
    p.add_argument("--store", default=os.environ.get("ARGUS_STORE",
                                                     "file:///var/lib/argus/traces"),
                   help="file:///dir or s3://bucket/prefix (default $ARGUS_STORE or "
                        "file:///var/lib/argus/traces)")
    p.add_argument("--spool", default="/var/lib/argus/spool", metavar="DIR",
                   help="upload spool directory (survives restarts); windows being written "
                        "live in its windows/ subdirectory")
    p.add_argument("--spool-max-mb", type=int, default=None,
                   help="upload spool cap (default 4096 MB); beyond it files are dropped, counted")
    p.add_argument("--window", type=float, default=60.0, metavar="SECONDS")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="how long a window waits for late records")
    p.add_argument("--max-body-mb", type=int, default=64, help="decompressed body limit")
    p.add_argument("--max-buffered-events", type=int, default=4_000_000,
                   help="kernel events waiting to be written before answering 503 "
                        "(~28 B each; default 4,000,000)")
    p.add_argument("--chunk-events", type=int, default=65_536,
                   help="a window's kernels are appended to its file and sketch in chunks "
                        "of this many (default 65,536)")
    p.add_argument("--top-k", type=int, default=32, help="kernels per rank on /metrics")
    p.add_argument("--token-env", default="ARGUS_PROCESSOR_TOKEN", metavar="VAR",
                   help="environment variable holding the bearer token (unset: no auth)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT."""
    from argus_core.processor.service import ProcessorConfig, serve

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        print(f"argus processor: error: --listen {args.listen!r}: expected HOST:PORT",
              file=sys.stderr)
        return 2
    config = ProcessorConfig(
        host=host or "127.0.0.1", port=int(port), store=args.store, spool_dir=args.spool,
        max_spool_bytes=(args.spool_max_mb << 20 if args.spool_max_mb is not None
                         else ProcessorConfig.max_spool_bytes),
        token=os.environ.get(args.token_env) or None,
        window_s=args.window, grace_s=args.grace, max_body_bytes=args.max_body_mb << 20,
        max_buffered_events=args.max_buffered_events, chunk_events=args.chunk_events,
        top_k=args.top_k)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        serve(config)
    except ValueError as exc:  # a bad store URL
        print(f"argus processor: error: {exc}", file=sys.stderr)
        return 2
    return 0
