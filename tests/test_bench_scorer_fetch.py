"""``bench/scorer_fetch.py`` on a small job: the scorer's peer-set selection by ranks reads the
same series as the join it replaces, from a real victoria-metrics, the whole job's fetch
decodes every rank's summaries, the export (``--read export``) gives the same summaries as
the query, and whole scorer rounds either way find the slow rank, also with every rank's
exporter series in the store (L2 beside L3). ``bench/scorer_overlap.py``
on a few small jobs: its rounds with and without fetching ahead agree. ``bench/vm_visibility.py``
times what the store shows of a new series and of a new sample. ``bench/export_decode.py``
reads the same columns both ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "scorer_fetch.py"


def test_the_fetch_benchmark_reads_every_summary_and_agrees_with_the_join():
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "80", "--kernels", "3",
                           "--rounds", "1", "--json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["peer_sets_agree"] and result["complete"]
    assert result["peer_set_export_agrees"] and result["exported_summaries_agree"]
    for read in ("query", "export"):  # the slow rank found by whole rounds either way
        assert result[f"{read}_one_scorer_verdicts"] == [f"{result['slow_rank']}:compute"]
        assert result[f"{read}_shard_of_5_round_seconds"] is not None
    assert result["peer_set_series"] == 80 // 5 * 3 * 2 * 3  # ranks x kernels x clusters x 3
    assert result["job_summary_rows"] == 80 * 3 * 2
    assert result["shard_summary_rows"] == 80 // 5 * 3 * 2


def test_the_overlap_benchmark_times_both_settings_and_they_agree():
    """``bench/scorer_overlap.py`` on three small jobs: rounds with the next job fetched
    ahead and one job at a time publish the same verdicts and kernel stragglers, each job's
    slow rank its only verdict, with each ``--read``."""
    bench = BENCH.parent / "scorer_overlap.py"
    done = subprocess.run([sys.executable, str(bench), "--jobs", "3", "--ranks", "80",
                           "--kernels", "3", "--rounds", "1", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["agree"] and result["found"]
    for read in ("query", "export"):
        assert result[f"{read}_ahead_round_seconds"] > 0
        assert result[f"{read}_one_at_a_time_round_seconds"] > 0


def test_the_visibility_benchmark_times_a_new_series_and_a_new_sample():
    """``bench/vm_visibility.py``: a new series' first sample and a held series' new sample
    each become visible to an instant query, and their times are reported; a bad count is
    refused by name."""
    bench = BENCH.parent / "vm_visibility.py"
    done = subprocess.run([sys.executable, str(bench), "--series", "1", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["series"] == 1 and "-search.latencyOffset" in result["engine"]
    for field in ("new_series_seconds", "new_sample_seconds"):
        low, high = result[f"{field}_range"]
        assert 0 < low <= result[field] <= high
    refused = subprocess.run([sys.executable, str(bench), "--series", "0"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--series" in refused.stderr


def test_the_fetch_benchmarks_rounds_judge_l2_beside_l3_with_the_exporters_series():
    """``--with-exporters --rounds-only``: the store holds every rank's exporter series too;
    whole rounds either way find the slow rank (its mlp phase and its kernel)."""
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "80", "--kernels", "3",
                           "--with-exporters", "--rounds-only", "--rounds", "2", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["with_exporters"] and result["store_series"] > 80 * 3 * 2 * 3
    for read in ("query", "export"):
        assert result[f"{read}_one_scorer_verdicts"] == [f"{result['slow_rank']}:compute"]
        for scorer in ("one_scorer", "shard_of_5"):  # each scorer's rounds, and their median
            rounds = result[f"{read}_{scorer}_rounds_seconds"]
            assert len(rounds) == 2 and None not in rounds
            assert result[f"{read}_{scorer}_round_seconds"] == sum(rounds) / 2


def test_the_decode_benchmark_reads_the_same_columns_both_ways():
    """``bench/export_decode.py`` on a small job: the values read in one pass and by
    ``float()`` each give the same columns, from the export and from the query answer."""
    done = subprocess.run([sys.executable, str(BENCH.parent / "export_decode.py"), "--ranks",
                           "20", "--kernels", "5", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["series"] == 20 * 5 * 2 * 2
    for read in ("export", "query"):
        assert result[f"{read}_same_columns"] is True
        assert result[f"{read}_ratio_to_baseline"] > 0
