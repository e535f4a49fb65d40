"""``bench/scorer_fetch.py`` on a small job: the scorer's peer-set selection by ranks reads the
same series as the join it replaces, from a real victoria-metrics, and the whole job's fetch
decodes every rank's summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "scorer_fetch.py"


def test_the_fetch_benchmark_reads_every_summary_and_agrees_with_the_join():
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "80", "--kernels", "3",
                           "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["peer_sets_agree"]
    assert result["peer_set_series"] == 80 // 5 * 3 * 2 * 3  # ranks x kernels x clusters x 3
    assert result["job_summary_rows"] == 80 * 3 * 2
    assert result["shard_summary_rows"] == 80 // 5 * 3 * 2
