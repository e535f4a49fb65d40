"""Render every Argus dashboard's panels as PNGs, from their own queries, for docs/dashboards.md.

    python bench/render_dashboards.py [--out docs/dashboards] [--minutes 30]
                                      [--rules recording_rules/argus.rules.yml ...] [--json]
    python bench/render_dashboards.py --live DIR --job JOB [--only UID ...] [--minutes 4]

Replays the dashboards' scenario (argus_grafana.scenario: a job with a host stall and a compute
straggler beside a healthy one, a processor outage, malformed records) through the real
exporter collectors and processor into Debian's Prometheus, backfills the recording rules if
given (default: the checkout's rules generated with ``l2_source: promql``, as no scorer runs
over a backfilled history), and draws each dashboard with
matplotlib (argus_grafana.render). Panels needing the scorer, live alerts or scrape series are
drawn grey with the reason. Prints the time each stage took and how many panels were drawn.

With ``--live DIR`` the panels are drawn instead from a running ``argus stack up --workdir DIR``
(its engine, scorer, alerts and ``argus act`` included) over the last ``--minutes``, for
``--job``: what the scorer and the planner show, which a backfilled history cannot hold.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _report import report

from argus_grafana import check, generate, scenario
from argus_grafana.render import Renderer, RenderStats

ROOT = Path(__file__).resolve().parent.parent
VALUES = {  # what a reader picks to look at the incident
    "argus-overview": {"job": [scenario.STRAGGLER_JOB, scenario.HEALTHY_JOB]},
    "argus-stragglers": {"job": [scenario.STRAGGLER_JOB], "axis": ["dp"],
                         "rank": [str(scenario.STRAGGLER_RANK)]},
    "argus-kernels": {"job": [scenario.STRAGGLER_JOB], "rank": [str(r) for r in range(8)],
                      "kernel": ["sm90_xmma_gemm_bf16_mlp_fc1"],
                      "traces": ["http://localhost:9700"]},
    "argus-pipeline": {"job": [scenario.STRAGGLER_JOB, scenario.HEALTHY_JOB]},
    "argus-suspects": {"job": [scenario.STRAGGLER_JOB, scenario.HEALTHY_JOB]},
}


def main() -> None:
    """Replay, render, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "dashboards"))
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rules", nargs="*", type=Path, default=None,
                        help="recording-rule files to backfill (default: the checkout's, "
                        "l2_source promql)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--live", metavar="DIR", help="draw from the stack running in DIR")
    parser.add_argument("--job", help="with --live: the job shown")
    parser.add_argument("--only", nargs="*", default=None, metavar="UID",
                        help="draw only these dashboards")
    args = parser.parse_args()
    if args.live:
        if not args.job:
            parser.error("--live needs --job")
        render_live(args)
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        rules = (check.backfill_rule_files(ROOT, Path(workdir)) if args.rules is None
                 else args.rules)
        replay = scenario.replay(workdir, minutes=args.minutes, rule_files=rules)
        replayed = time.perf_counter()
        try:
            present = check.present_sources(replay.prometheus.url, replay.start_s,
                                            replay.end_s)
            total = RenderStats()
            for uid, build in generate.BUILDERS.items():
                if args.only and uid not in args.only:
                    continue
                board = __import__("json").loads(generate.encode(build()))
                values = {**VALUES[uid], "__rate_interval": ["1m"],
                          "__range": [f"{int(replay.end_s - replay.start_s)}s"]}
                shown = ", ".join(f"{k}={'|'.join(v)}" for k, v in VALUES[uid].items()
                                  if k != "traces")
                stats = Renderer(replay.prometheus.url, replay.start_s, replay.end_s, values,
                                 present).render(board, Path(args.out) / f"{uid}.png", shown)
                for field in ("panels", "drawn", "placeholders"):
                    setattr(total, field, getattr(total, field) + getattr(stats, field))
        finally:
            replay.prometheus.stop()
    done = time.perf_counter()
    report({"dashboards": len(generate.BUILDERS), "panels": total.panels, "drawn": total.drawn,
            "placeholders": total.placeholders, "samples": replay.samples,
            "recorded_rules": len(replay.recorded_rules), "replay_s": replayed - started,
            "render_s": done - replayed}, args.json)


def render_live(args) -> None:
    """Draw the chosen dashboards from a running local stack, for one job."""
    from argus_core.stack.stack import Stack

    url = Stack.load(args.live).urls["prometheus"]
    end_s = time.time()
    start_s = end_s - args.minutes * 60
    present = check.present_sources(url, start_s, end_s)
    total = RenderStats()
    for uid, build in generate.BUILDERS.items():
        if args.only and uid not in args.only:
            continue
        board = __import__("json").loads(generate.encode(build()))
        values = {"job": [args.job], "axis": ["dp"], "__rate_interval": ["4s"],
                  "__range": [f"{int(end_s - start_s)}s"]}
        stats = Renderer(url, start_s, end_s, values, present).render(
            board, Path(args.out) / f"{uid}.png", f"job={args.job} (live stack)")
        for field in ("panels", "drawn", "placeholders"):
            setattr(total, field, getattr(total, field) + getattr(stats, field))
    report({"panels": total.panels, "drawn": total.drawn,
            "placeholders": total.placeholders}, args.json)


if __name__ == "__main__":
    main()
