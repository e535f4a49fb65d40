"""``argus score``: run the scoring job (L2 and L3) against Prometheus."""

from __future__ import annotations

import argparse
import logging
import sys

from argus_core.score.limits import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_TIMEOUT_S


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "score", help="run the scoring job (L2 and L3) against Prometheus",
        description="Every --interval, query the processors' kernel summaries and the "
                    "exporters' phase medians from Prometheus, judge them with the core's L3 "
                    "(W1 against healthy peers) and L2 (every axis), and serve "
                    "argus_kernel_w1_score, argus_kernel_straggler, argus_verdict, "
                    "argus_phase_straggler_ratio and the L2 group statistics on /metrics for "
                    "Prometheus to scrape.")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus (or Mimir/Thanos query frontend) base URL")
    p.add_argument("--listen", default="127.0.0.1:9800", metavar="HOST:PORT",
                   help="where /metrics is served (default 127.0.0.1:9800)")
    p.add_argument("--interval", type=float, default=60.0, metavar="S",
                   help="seconds between rounds (default 60, the processors' window)")
    p.add_argument("--shard", default="0/1", metavar="I/N",
                   help="score only shard I of N: the jobs whose name hashes to it, or with "
                        "--split peer-set its peer sets of every job (default 0/1)")
    p.add_argument("--split", default="job", choices=["job", "peer-set"],
                   help="what the shards divide: whole jobs (default), or each job's peer "
                        "sets, the ranks at one position of --peer-axis, so that one large "
                        "job is scored by several scorers")
    p.add_argument("--peer-axis", default="pp", choices=["dp", "tp", "pp", "ep"],
                   help="ranks at the same position on this axis are peers (default pp)")
    p.add_argument("--window", type=float, default=60.0, metavar="S",
                   help="the processors' --window (default 60)")
    p.add_argument("--rate-window", default=None, metavar="DURATION",
                   help="window of each rank's steps per second (default 2m)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="deadline of each query attempt: connecting, sending and the whole "
                        f"answer (default {DEFAULT_TIMEOUT_S:g}; retried twice)")
    p.add_argument("--max-answer-mb", type=int, default=DEFAULT_MAX_ANSWER_BYTES >> 20,
                   metavar="MiB",
                   help="longest answer read from Prometheus per query; a longer one fails "
                        f"its job (default {DEFAULT_MAX_ANSWER_BYTES >> 20}: a peer set of "
                        "2,000 ranks x 100 kernels is about 170 MB)")
    p.add_argument("--read", default="query", choices=["query", "export"],
                   help="how the kernel summaries and the ranks' windows are read: query, "
                        "instant queries through the Prometheus API any engine serves "
                        "(default); export, "
                        "victoria-metrics' /api/v1/export/csv, decoded as it streams: "
                        "0.3x the fetch time at 10,000 ranks x 100 kernels "
                        "(docs/BENCHMARKS.md)")
    p.add_argument("--lookback", type=float, default=30.0, metavar="S",
                   help="with --read export: a series' last sample within this many seconds "
                        "counts (default 30; two scrape intervals and a few seconds for "
                        "the samples' delivery to the store)")
    p.add_argument("--fetch-ahead", type=int, default=1, metavar="JOBS",
                   help="jobs fetched while the one before is judged, each held in memory "
                        "until judged (default 1; 0: fetch and judge one job at a time)")
    p.add_argument("--config", metavar="FILE",
                   help="the rules' config (argus.yml's keys): the scorer takes the settings "
                        "it shares with the rules from it: l2_source (which L2 findings to "
                        "publish), axes, rate_window and the exporters' and processors' "
                        "selector (the flags below override it)")
    p.add_argument("--selector", default=None, metavar="MATCHERS",
                   help="extra label matchers, e.g. 'cluster=\"eu\"'")
    p.add_argument("--l2-findings", default=None, choices=["all", "beyond-promql"],
                   help="L2 findings to publish: all (default; rules with l2_source: "
                        "scorer) or only those the l2_source: promql rules cannot make")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT."""
    from argus_core.cli.listen import host_port
    from argus_core.score.service import ScoreConfig, serve

    index, slash, count = args.shard.partition("/")
    try:
        host, port = host_port(args.listen)
        if args.max_answer_mb < 1:
            raise ValueError(f"--max-answer-mb {args.max_answer_mb}: expected a whole number "
                             f"of MiB >= 1")
        if not slash or not index.isdigit() or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--shard {args.shard!r}: expected I/N, e.g. 0/4")
        shared = shared_settings(args.config, selector_given=args.selector is not None)
        flags = {"selector": args.selector, "l2_findings": args.l2_findings,
                 "rate_window": args.rate_window}
        shared.update({k: v for k, v in flags.items() if v is not None})
        config = ScoreConfig(prometheus=args.prometheus, interval_s=args.interval,
                             shard=int(index), shards=int(count), split=args.split,
                             peer_axis=args.peer_axis,
                             window_s=args.window, timeout_s=args.timeout,
                             max_answer_bytes=args.max_answer_mb << 20, read=args.read,
                             lookback_s=args.lookback, fetch_ahead=args.fetch_ahead,
                             **shared)
        from argus_core.score.prometheus import PrometheusAPI

        PrometheusAPI(config.prometheus, timeout_s=config.timeout_s)  # validates the URL
    except (OSError, ValueError) as exc:
        print(f"argus score: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(config, host, port)
    return 0


def shared_settings(path: str | None, selector_given: bool = False) -> dict:
    """The ScoreConfig settings the rules' config decides (none without a file): which L2
    findings to publish for its ``l2_source`` and on which ``axes`` the rules compare, its
    ``rate_window``, and its selector when the exporters' and processors' agree (the scorer
    reads both with one)."""
    if path is None:
        return {}
    from argus_core.rules.config import L2_PROMQL, format_duration, load_config
    from argus_core.score.core_adapter import L2_FINDINGS_ALL, L2_FINDINGS_BEYOND_PROMQL

    rules = load_config(path)
    if rules.selectors.exporters != rules.selectors.processor and not selector_given:
        raise ValueError(f"{path}: the scorer reads the exporters' and the processors' series "
                         f"with one selector, but selectors.exporters is "
                         f"{rules.selectors.exporters!r} and selectors.processor "
                         f"{rules.selectors.processor!r}: make them equal or pass --selector")
    promql = rules.l2_source == L2_PROMQL
    return {"l2_findings": L2_FINDINGS_BEYOND_PROMQL if promql else L2_FINDINGS_ALL,
            "promql_axes": rules.axes, "rate_window": format_duration(rules.rate_window),
            "selector": rules.selectors.exporters}
