"""The diagnosis on recordings of real training jobs (torch on CPU, gloo): DDP at 1 to 8 ranks,
and FSDP2, DTensor tensor parallel, a send/recv pipeline and an all-to-all MoE layer.

The recordings under ``tests/data/real_jobs`` were made by ``bench/real_jobs.py --record``:
real jobs on a shared 2-core machine, with its scheduler noise, blips of 1.5-3x on single
steps and ranks that drift. Healthy jobs must get no verdict; a faulty one exactly its rank
and cause. Edited copies of a healthy recording show the rules a real user relies on: a
one-off blip is never a verdict, repeated stalls are, and a finding that costs nothing is not.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from argus_core.detect.diagnose import diagnose
from argus_core.detect.l1 import L1Config, detect_l1, spike_threshold
from argus_core.detect.steps import step_matrix
from argus_core.reader import load_traces
from argus_core.simulate import CASES, REAL_CPU, SimConfig, fit_noise, simulate_trace
from argus_core.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "real_jobs"
_spec = importlib.util.spec_from_file_location("real_jobs", ROOT / "bench" / "real_jobs.py")
real_jobs = importlib.util.module_from_spec(_spec)
sys.path.insert(0, str(ROOT / "bench"))
sys.modules["real_jobs"] = real_jobs  # dataclasses look their module up
_spec.loader.exec_module(real_jobs)
EXPECTED = {case.name: case.expected for case in real_jobs.CASES}
PEERS = {case.name: case.peers for case in real_jobs.CASES}
RANKS = {case.name: case.ranks for case in real_jobs.CASES}
RECORDINGS = sorted(DATA.glob("*.ndjson.gz"))


def _case(path: Path) -> str:
    return re.sub(r"-run\d+$", "", path.name.split(".ndjson")[0])


def _trace(path: Path):
    traces = load_traces([path]).traces
    assert len(traces) == 1
    return next(iter(traces.values()))


def test_every_case_of_the_bench_has_a_recording():
    """The committed set covers every case the bench runs (healthy at 1, 2, 4 and 8 ranks,
    one-line and zero-code, and every fault kind)."""
    assert {_case(p) for p in RECORDINGS} == set(EXPECTED)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.split(".")[0])
def test_real_job_gets_exactly_its_verdicts(path):
    """Healthy: no verdict; faulty: exactly the faulty rank with its cause, with its cost."""
    doc = diagnose(_trace(path)).to_json()
    found = {v["rank"]: v["cause"] for v in doc["verdict"]}
    assert found == EXPECTED[_case(path)], doc["verdict"]
    # a slow link's two ends each name the other; no other verdict names a peer
    assert {v["rank"]: v["peer"] for v in doc["verdict"] if "peer" in v} == PEERS[_case(path)]
    for verdict in doc["verdict"]:
        assert verdict["cost_share"] >= 0.02 and "costs the job" in verdict["evidence"]


@pytest.mark.parametrize("path", sorted(DATA.glob("hog-1-late*.ndjson.gz")),
                         ids=lambda p: p.name.split(".")[0])
def test_a_one_rank_job_short_of_cpu_from_a_step_on_is_host(path):
    """A one-rank job with a busy process on its core from step 30: its compute doubles with
    no peer to compare it with. Its training thread's wait for a CPU rose as much from step
    30 as its step did, so the verdict is host (short of CPU, against its own wait before);
    the same recording without the waits recorded is a compute regression."""
    (verdict,) = diagnose(_trace(path)).to_json()["verdict"]
    assert verdict["cause"] == "host", verdict
    onset = re.search(r"short of CPU: its training thread waited [\d.]+ ms a step longer for "
                      r"a CPU than before step (\d+)", verdict["evidence"])
    assert onset and 28 <= int(onset[1]) <= 33, verdict["evidence"]
    blind = _trace(path)
    blind.steps.cpu_wait_s = np.full(len(blind.steps), np.nan)
    (verdict,) = diagnose(blind).to_json()["verdict"]
    assert verdict["cause"] == "compute" and "compute time +" in verdict["evidence"]


def test_a_noisy_cpu_job_calibrates_its_own_spike_threshold():
    """The CPU jobs' own noise lifts the spike threshold above the 1.5x floor (their healthy
    blips reach 2-3x), while a quiet simulated GPU job keeps the floor: the same 1.5x stall
    counts on one and not on the other."""
    noisy = [p for p in RECORDINGS if _case(p) in ("healthy-2", "healthy-4", "healthy-8")]
    spikes = {}
    for path in noisy:
        l1 = detect_l1(step_matrix(_trace(path).steps))
        assert l1.spike_threshold > 2.0, path.name
        spikes[path.name] = l1.spikes
    # About spike_alpha false spikes per job: a rare real one, never a spike per recording.
    assert sum(map(len, spikes.values())) <= len(noisy) // 4, spikes
    quiet = simulate_trace(CASES["healthy"].config(seed=0))
    assert detect_l1(step_matrix(quiet.steps)).spike_threshold == L1Config().spike_ratio


@pytest.mark.parametrize(("steps", "stalls"), [(200, 4), (18, 2), (40, 3)])
def test_spike_threshold_reads_the_tail_not_the_outliers(steps, stalls):
    """A job's own few stalls barely move its threshold, long job or short (the tail is read
    at a level they stay above; the rest shifts by an order statistic at most)."""
    rng = np.random.default_rng(steps)
    ratio = np.exp(rng.laplace(0, 0.05, steps))
    base = spike_threshold(ratio, L1Config())
    ratio[:stalls] = 30.0
    assert base <= spike_threshold(ratio, L1Config()) <= 1.3 * base


def _edited(path: Path, tmp_path: Path, rank: int, extra_s: dict[int, float]) -> Path:
    """A copy of a recording where ``rank`` stalls on the host ``extra_s[step]`` seconds
    before the given steps, and every other rank waits for it in its all-reduce."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / path.name
    with gzip.open(path, "rb") as src, gzip.open(out, "wb") as dst:
        for line in src:
            record = orjson.loads(line)
            extra = extra_s.get(record.get("step", -1), 0.0) if record["kind"] == "step" else 0
            if extra:
                record["wall_s"] += extra
                if record["rank"] != rank:
                    record["gpu_s"] += extra
                    record["phases"]["dp-allreduce"] += extra
            dst.write(json.dumps(record).encode() + b"\n")
    return out


@pytest.mark.parametrize("name", ["healthy-2", "healthy-4", "healthy-8"])
def test_a_one_off_stall_is_never_a_verdict_and_repeated_ones_are(name, tmp_path):
    """One 0.4 s host stall on rank 1 of a real healthy job: a spike attributed to rank 1 in
    L1, but no verdict (one-off). The same stall at two steps: rank 1, host."""
    path = DATA / f"{name}.ndjson.gz"
    once = diagnose(_trace(_edited(path, tmp_path / "1", 1, {30: 0.4})))
    assert [s for s, _ in once.l1.spikes] == [30]
    assert {(c.rank, c.cause) for c in once.l1.culprits if c.step == 30} == {(1, "host")}
    assert once.verdicts == []
    twice = diagnose(_trace(_edited(path, tmp_path / "2", 1, {20: 0.4, 40: 0.4})))
    assert {v.rank: v.cause for v in twice.verdicts} == {1: "host"}
    assert "at steps 20 (+" in twice.verdicts[0].evidence


def test_a_verdict_under_the_cost_floor_is_minor(tmp_path):
    """A single-rank real job (8 ms steps) that stalls 6 ms at two steps: two spikes of a
    quiet job, a host verdict that costs it ~2.6% of its step. With the floor at 5% the same
    finding is listed as minor, with its cost, and is no verdict."""
    from argus_core.detect.diagnose import DiagnoseConfig

    path = DATA / "healthy-1.ndjson.gz"
    trace = _trace(_edited(path, tmp_path, 0, {20: 0.006, 40: 0.006}))
    d = diagnose(trace)
    assert [s for s, _ in d.l1.spikes] == [20, 40]
    assert [(v.rank, v.cause) for v in d.verdicts] == [(0, "host")] and d.minor == []
    share = d.verdicts[0].cost.share
    assert 0.02 <= share < 0.05
    strict = diagnose(trace, DiagnoseConfig().with_overrides(["verdict.min_cost_share=0.05"]))
    assert strict.verdicts == [] and [(v.rank, v.cause) for v in strict.minor] == [(0, "host")]
    assert strict.minor[0].cost.share == pytest.approx(share)


def _device_timed(path: Path, tmp_path: Path) -> Path:
    """A copy of a recording whose steps say their phases were timed on a device (each step
    anchored on the device clock, as an exporter with CUDA events records it)."""
    out = tmp_path / path.name
    with gzip.open(path, "rb") as src, gzip.open(out, "wb") as dst:
        for line in src:
            record = orjson.loads(line)
            if record["kind"] == "step":
                record["gpu_t_ns"] = record["t_ns"]
            dst.write(orjson.dumps(record) + b"\n")
    return out


def test_ranks_apart_on_the_host_clock_are_no_verdict_but_on_a_device_they_are(tmp_path):
    """A healthy real job whose rank 1 ran 1.3-1.6x slower than rank 0 in every phase for
    the whole run (the scheduler's share of its cores): on the host clock that is within the
    rank-to-rank spread of ``l2.host_scale_floor``, and no verdict. The same times measured
    on a device, where ranks agree to ``l2.scale_floor``, make rank 1 a compute straggler."""
    path = DATA / "healthy-2-run4.ndjson.gz"
    host = diagnose(_trace(path))
    assert not host.context.device and host.verdicts == []
    device = diagnose(_trace(_device_timed(path, tmp_path)))
    assert device.context.device
    assert {v.rank: v.cause for v in device.verdicts} == {1: "compute"}
    assert {f.phase for f in device.l2.findings if f.rank == 1} >= {"forward", "backward"}


def test_a_link_slow_while_its_ends_wait_for_a_cpu_is_the_hosts_load_not_the_link():
    """A healthy four-rank pipeline on a loaded 2-core machine: from step 36 the messages of
    link 2 -> 3 took 17.7x as long at both ends while rank 2's training thread waited 12 ms a
    step longer for a CPU. That is the host's load: a warning names the link, no verdict.
    Without the CPU-wait rule, both ends would be blamed for a slow link."""
    from argus_core.detect.diagnose import DiagnoseConfig

    trace = _trace(DATA / "pp-healthy-4-run4.ndjson.gz")
    d = diagnose(trace)
    assert d.verdicts == [] and d.links == []
    (note,) = [w for w in d.warnings if w.startswith("link ")]
    assert note.startswith("link 2 -> 3 slowed") and "host's load" in note
    blind = diagnose(trace, DiagnoseConfig().with_overrides(["links.cpu_wait_share=1000"]))
    assert {v.rank: (v.cause, v.peer) for v in blind.verdicts} == {
        2: ("communication", 3), 3: ("communication", 2)}


def test_a_degraded_link_is_named_though_its_ends_run_short_of_cpu_a_little():
    """A four-rank pipeline whose link 1 -> 2 delays each send 5 ms (a sleep before the send:
    off the CPU): its ends' wait for a CPU rose about 1 ms a step, far below the link's ~20 ms,
    so the link is named as before."""
    d = diagnose(_trace(DATA / "pp4-link-4-run2.ndjson.gz"))
    (link,) = [f for f in d.links if (f.sender, f.receiver) == (1, 2)]
    assert 0 <= link.cpu_wait_rise_s < 0.1 * link.excess_s and not link.short_of_cpu
    assert {v.rank: v.peer for v in d.verdicts} == {1: 2, 2: 1}


def test_bench_runs_a_fresh_real_job(tmp_path):
    """``bench/real_jobs.py`` starts a real job and judges it: its last line is the summary."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "real_jobs.py"), "--json",
                           "--runs", "1", "--cases", "stall-1", "--steps", "50",
                           "--record", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"runs", "cases", "as_expected", "false_verdicts"} <= set(summary)
    assert summary["runs"] == 1 and summary["cases"] == 1
    assert summary["as_expected"] == 1 and summary["false_verdicts"] == 0, proc.stderr
    assert (tmp_path / "stall-1.ndjson.gz").exists()


def test_busy_neighbours_run_beside_the_block_and_are_gone_after():
    """``--busy``: the busy processes exist while the cases run, and none outlives them."""
    with real_jobs.busy_neighbours(2, 0.5) as pids:
        assert len(pids) == 2
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # killed and reaped


def _own_seconds(trace):
    """Each rank's own time per step (wall less waiting), warm-up left out."""
    from argus_core.detect.arrival import collective_times

    matrix = step_matrix(trace.steps)
    times = collective_times(matrix, trace.coords(matrix.ranks))
    return (matrix.wall - times.wait_s)[:, 2:]


def test_the_real_noise_model_is_what_the_recordings_show():
    """REAL_CPU is fitted to the healthy multi-rank recordings: each of its numbers lies
    within the range the recordings give (the 1-rank job, alone on its core, is quieter)."""
    fits = [fit_noise(_own_seconds(_trace(p))) for p in RECORDINGS
            if _case(p) in ("healthy-2", "healthy-2-zero-code", "healthy-4", "healthy-8")]
    assert len(fits) >= 8
    for name in ("step_jitter", "drift", "blip_rate", "blip_excess"):
        values = sorted(getattr(f, name) for f in fits)
        low, high = values[len(values) // 10], values[-1 - len(values) // 10]
        assert low * 0.8 <= getattr(REAL_CPU, name) <= high * 1.2, (name, values)


def test_fit_noise_reads_back_what_the_simulator_put_in():
    """A simulated job with REAL_CPU noise fits back to about REAL_CPU."""
    trace = simulate_trace(SimConfig(topology=Topology(dp=8), steps=80, seed=3,
                                     step_noise=REAL_CPU))
    fitted = fit_noise(_own_seconds(trace))
    assert fitted.step_jitter == pytest.approx(REAL_CPU.step_jitter, rel=0.3)
    assert fitted.drift == pytest.approx(REAL_CPU.drift, rel=0.4)
    assert fitted.blip_rate == pytest.approx(REAL_CPU.blip_rate, rel=0.5)


def test_fit_noise_refuses_too_short_a_job():
    """Fewer than 8 steps cannot tell drift from jitter: a clear error."""
    with pytest.raises(ValueError, match="at least 8 steps"):
        fit_noise([[0.1] * 5])
