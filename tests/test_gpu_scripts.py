"""The GPU scripts, dry-run on a CPU so they work the first time a device is lent.

They run from a plain checkout there (Argus not installed): here the editable install is hidden
from them (a ``sitecustomize`` drops its import finder), so ``argus_exporters`` must come from
``exporters/``. Without a GPU each script says why in one JSON line and its ``--out`` file;
``--dry-run`` runs the orchestration (children, deadline, probes' set-up) without one;
``bench/gpu_all.sh`` runs both scripts and writes its summary under ``$OUT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
HIDE_INSTALL = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if "__editable__" not in getattr(f, "__module__", "")
                    and "__editable__" not in type(f).__module__]
"""


@pytest.fixture(scope="module")
def plain_env(tmp_path_factory) -> dict[str, str]:
    """An environment in which Argus is not installed (and no GPU is visible)."""
    site = tmp_path_factory.mktemp("plain-site")
    (site / "sitecustomize.py").write_text(HIDE_INSTALL)
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "ARGUS_CUPTI_SHIM")}
    env.update(PYTHONPATH=str(site), ARGUS_CACHE_DIR=str(tmp_path_factory.mktemp("cache")),
               CUDA_VISIBLE_DEVICES="")
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, dict, str]:
    """Run a script; (exit code, its last JSON line, stderr)."""
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-3000:]
    return done.returncode, json.loads(lines[-1]), done.stderr


def test_the_editable_install_is_hidden(plain_env):
    code = "import importlib.util; print(importlib.util.find_spec('argus_exporters'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=plain_env, check=True)
    assert done.stdout.strip() == "None"


def test_kernels_check_dry_run_from_a_plain_checkout(plain_env, tmp_path):
    env = {**plain_env, "ARGUS_KERNEL_CALLBACKS": "shim"}
    out = tmp_path / "k.json"
    code, result, stderr = run([str(BENCH / "gpu_kernels_check.py"), "--dry-run", "--only",
                                "compare", "--out", str(out)], env)
    assert code == 0 and result["ok"] is True, (result, stderr[-2000:])
    assert set(result["parts"]) == {"compare"}
    for part in result["parts"].values():
        assert part["dry_run"] and part["plumbing"] == "argus shim"  # the shim was built
        assert part["argus_exporters"].endswith("(plain checkout)")
    assert json.loads(out.read_text()) == result


def test_kernels_check_deadline_skips_what_does_not_fit(plain_env, tmp_path):
    code, result, _ = run([str(BENCH / "gpu_kernels_check.py"), "--dry-run", "--deadline-s",
                           "5", "--out", str(tmp_path / "k.json")], plain_env)
    assert code == 1 and result["ok"] is False
    assert all("deadline" in part["skipped"] for part in result["parts"].values())
    assert any("skipped" in problem for problem in result["problems"])


def test_kernels_check_rejects_an_unknown_part(plain_env):
    done = subprocess.run([sys.executable, str(BENCH / "gpu_kernels_check.py"), "--only",
                           "compare,bogus"], capture_output=True, text=True, env=plain_env,
                          timeout=120, check=False)
    assert done.returncode == 2 and "unknown part 'bogus'" in done.stderr


def test_overhead_dry_run_runs_the_abba_rounds_on_cpu(plain_env, tmp_path):
    out = tmp_path / "o.json"
    code, result, stderr = run([str(BENCH / "gpu_overhead.py"), "--dry-run", "--out",
                                str(out)], plain_env)
    assert code == 0 and result["ok"], stderr[-2000:]
    assert result["argus_exporters"].endswith("(plain checkout)")
    for kind in ("launch_heavy", "gemm_heavy", "transformer"):
        assert result[kind]["rounds"] == 1
        assert set(result[kind]) >= {"all_on_overhead_pct", "defaults_overhead_pct",
                                     "phases_only_overhead_pct", "defaults_meets_target"}
    assert result["probes"]["kernels"][0] == "unavailable"  # no CUDA: said, not crashed
    assert result["records_shipped"] > 0 and not result["dropped"]
    assert json.loads(out.read_text()) == result


def test_collectives_dry_run_from_a_plain_checkout(plain_env, tmp_path):
    """gloo and the host clock: both collectives recorded, forward its own work, the cost per
    collective measured against the unhooked calls."""
    out = tmp_path / "c.json"
    code, result, stderr = run([str(BENCH / "gpu_collectives.py"), "--dry-run", "--steps",
                                "12", "--pairs", "2", "--out", str(out)], plain_env)
    assert code == 0 and result["ok"] is True, (result, stderr[-2000:])
    assert result["argus_exporters"].endswith("(plain checkout)")
    assert all(result["checks"].values())
    assert result["phases_ms"]["dp-allreduce"] > 0 and len(
        result["collective_overhead_cpu_us_pairs"]) == 2
    assert json.loads(out.read_text()) == result


def test_gpu_all_without_a_gpu_writes_why_under_out(plain_env, tmp_path):
    """Every script, from a plain checkout, say in their JSON why they cannot run; the shim and
    the bulk event reader are built; the summary lists what is missing."""
    env = {**plain_env, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(BENCH / "gpu_all.sh")], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 2, done.stdout[-3000:]  # no GPU here
    summary = json.loads((tmp_path / "gpu_all.json").read_text())
    assert summary["exit"] == {"gpu_kernels_check": 2, "gpu_overhead": 2, "gpu_collectives": 2}
    assert summary["ok"] is False
    assert summary["shim"] and os.path.isfile(summary["shim"])  # built with gcc
    assert summary["events_lib"] and os.path.isfile(summary["events_lib"])  # the bulk reader
    assert set(summary["missing_wheels"]) <= {"cupti_python", "orjson", "py_spy"}
    assert "no GPU" in summary["kernels"]["error"]
    for script in ("gpu_kernels_check", "gpu_overhead", "gpu_collectives"):
        result = json.loads((tmp_path / f"{script}.json").read_text())
        assert result["ok"] is False and "no GPU" in result["error"]
        assert result["versions"]["python"]
    assert {p.name for p in tmp_path.iterdir()} >= {
        "gpu_all.json", "gpu_all.log", "gpu_kernels_check.json", "gpu_overhead.json",
        "gpu_collectives.json"}
    assert summary["elapsed_s"] < 480


def test_gpu_all_passes_its_overhead_options_through(plain_env, tmp_path):
    """GPU_OVERHEAD_ARGS reaches gpu_overhead.py (longer segments for the next device run):
    an option it does not know is refused by name in the log, and the summary still says so."""
    env = {**plain_env, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "GPU_OVERHEAD_ARGS": "--steps 7 --no-such-option"}
    done = subprocess.run(["bash", str(BENCH / "gpu_all.sh")], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    log = (tmp_path / "gpu_all.log").read_text()
    assert "unrecognized arguments: --no-such-option" in log, log[-3000:]
    assert "--steps" not in log.split("unrecognized arguments:")[1].splitlines()[0]
    summary = json.loads((tmp_path / "gpu_all.json").read_text())
    assert summary["exit"]["gpu_overhead"] == 2 and done.returncode != 0
