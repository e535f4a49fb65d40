"""The ``argus`` command line: simulate, diagnose (text, --json, --plot), demo, --version."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from argus_core import __version__
from argus_core.cli import main
from argus_core.simulate import CASES, simulate, write_records
from argus_core.stack.processes import Process, _start_time
from argus_core.stack.stack import Stack

STEPS = 20  # compute-straggler's fault starts at step 15: 20 steps keep every finding
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ARGUS_SCRIPT = Path(sys.executable).parent / "argus"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``argus ARGV`` in-process; return (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def diagnose_json(capsys, *argv: str) -> dict:
    """Run ``argus diagnose ARGV --json`` and return the parsed document (exit status 0)."""
    code, out, err = run(capsys, "diagnose", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def straggler_dir(tmp_path_factory) -> Path:
    """compute-straggler (rank 5 slow in attention and mlp from step 15), 20 steps."""
    directory = tmp_path_factory.mktemp("compute-straggler")
    write_records(simulate(CASES["compute-straggler"].config(seed=0, steps=STEPS)), directory)
    return directory


@pytest.fixture(scope="module")
def straggler_doc(straggler_dir) -> dict:
    """The diagnose --json document of straggler_dir (computed once)."""
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        assert main(["diagnose", str(straggler_dir), "--json"]) == 0
    return json.loads(capture.getvalue())


# --------------------------------------------------------------------------- simulate


def test_simulate_writes_one_file_per_rank(tmp_path, capsys):
    """`argus simulate --case compute-straggler --out DIR` writes a valid NDJSON file per rank."""
    out = tmp_path / "trace"
    code, stdout, _ = run(capsys, "simulate", "--case", "compute-straggler", "--out", str(out),
                          "--steps", str(STEPS))
    assert code == 0
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [f"rank-{r:05d}.ndjson" for r in range(8)]
    assert "wrote 8 rank files" in stdout
    assert "compute-straggler" in stdout
    first = [json.loads(line) for line in files[5].read_text().splitlines()]
    assert first[0] == {**first[0], "v": 1, "kind": "rank", "rank": 5,
                        "job": "compute-straggler"}
    assert sum(rec["kind"] == "step" for rec in first) == STEPS


def test_simulate_gzip_output_is_diagnosable(tmp_path, capsys):
    """`argus simulate --gzip` writes .ndjson.gz files that `argus diagnose` reads."""
    out = tmp_path / "gz"
    assert run(capsys, "simulate", "--case", "compute-straggler", "--out", str(out), "--steps",
               str(STEPS), "--gzip")[0] == 0
    files = sorted(out.iterdir())
    assert files and all(f.name.endswith(".ndjson.gz") for f in files)
    assert gzip.decompress(files[0].read_bytes()).startswith(b"{")
    doc = diagnose_json(capsys, str(out))
    assert {v["rank"]: v["cause"] for v in doc["verdict"]} == {5: "compute"}


def test_simulate_job_name_and_topology_options(tmp_path, capsys):
    """--job names the job and --topology sets the number of rank files."""
    out = tmp_path / "t"
    code, stdout, _ = run(capsys, "simulate", "--out", str(out), "--topology", "dp=2,tp=2",
                          "--steps", "3", "--job", "myjob")
    assert code == 0
    assert len(list(out.iterdir())) == 4
    assert "'myjob'" in stdout
    assert json.loads((out / "rank-00000.ndjson").read_text().splitlines()[0])["job"] == "myjob"


def test_simulate_fault_rank_outside_world_exits_2(tmp_path, capsys):
    """A --fault naming rank 99 in an 8-rank job exits 2, names rank 99, and writes nothing."""
    out = tmp_path / "t"
    code, _, err = run(capsys, "simulate", "--out", str(out), "--fault",
                       "compute:ranks=99:phases=mlp*2")
    assert code == 2
    assert "rank 99" in err
    assert "world size 8" in err
    assert not out.exists()


@pytest.mark.parametrize("spec", [
    "compute:ranks=5",                           # missing phases=
    "gpu:ranks=1:phases=mlp*2",                  # unknown kind
    "compute:ranks=5:phases=mlp*x",              # factor not a number
    "compute:ranks=5:phases=mlp",                # factor missing
    "compute:ranks=five:phases=mlp*2",           # rank not a number
    "compute:ranks=5:phases=mlp*2:speed=3",      # unknown key
    "compute:ranks=5:phasesmlp*2",               # not key=value
    "stall:ranks=3:steps=12",                    # missing seconds=
    "link:ranks=0-1:axis=zz:factor=2",           # unknown axis
    "",                                          # empty
])
def test_simulate_malformed_fault_exits_2(tmp_path, capsys, spec):
    """A malformed --fault spec exits 2 with an error message, not a traceback."""
    code, _, err = run(capsys, "simulate", "--out", str(tmp_path / "t"), "--fault", spec)
    assert code == 2
    assert err.startswith("argus simulate: error: ")
    assert "fault" in err
    assert "Traceback" not in err


def test_simulate_fault_with_unknown_phase_exits_2(tmp_path, capsys):
    """--fault compute:...:phases=foo*2 (no phase 'foo') exits 2 naming the phase."""
    code, _, err = run(capsys, "simulate", "--out", str(tmp_path / "t"), "--fault",
                       "compute:ranks=5:phases=foo*2")
    assert code == 2
    assert "foo" in err


def test_simulate_fault_with_negative_factor_exits_2(tmp_path, capsys):
    """A negative slowdown factor in --fault is rejected with exit status 2."""
    code, _, _ = run(capsys, "simulate", "--out", str(tmp_path / "t"), "--fault",
                     "compute:ranks=1:phases=mlp*-2")
    assert code == 2


def test_simulate_bad_topology_exits_2(tmp_path, capsys):
    """A malformed --topology exits 2 with an error naming the bad part."""
    code, _, err = run(capsys, "simulate", "--out", str(tmp_path / "t"), "--topology", "dp=x")
    assert code == 2
    assert "dp=x" in err


def test_simulate_zero_steps_exits_2(tmp_path, capsys):
    """`argus simulate --steps 0` is an error (exit 2), not a 40-step run."""
    code, _, err = run(capsys, "simulate", "--out", str(tmp_path / "t"), "--steps", "0")
    assert code == 2
    assert "steps" in err


# --------------------------------------------------------------------------- diagnose --json


COST = {"cost_s", "cost_share", "gpu_seconds"}  # added fields of findings and verdicts


def test_diagnose_json_has_exactly_the_design_top_level_keys(straggler_doc):
    """The --json document has exactly job, l1, l2, l3, verdict and the documented additions
    at the top level (not_judged: the levels that had no data, empty when every level could
    look; minor: verdicts that cost less than the floor; suspects: the hardware the verdicts
    point at)."""
    assert set(straggler_doc) == {"job", "l1", "l2", "l3", "verdict", "not_judged", "minor",
                                  "suspects"}
    assert straggler_doc["not_judged"] == []
    assert straggler_doc["job"] == "compute-straggler"
    assert set(straggler_doc["l1"]) == {"spikes", "regressions"}
    assert set(straggler_doc["l2"]) == {"stragglers", "host", "links"}
    assert set(straggler_doc["l3"]) == {"stragglers"}
    assert isinstance(straggler_doc["verdict"], list)


def test_diagnose_json_entries_use_design_field_names(straggler_doc):
    """Each list entry carries exactly the DESIGN.md fields (plus the documented cost fields),
    with JSON types that match."""
    doc = straggler_doc
    assert doc["l1"]["regressions"] and doc["l2"]["stragglers"]
    assert doc["l3"]["stragglers"] and doc["verdict"]
    for entry in doc["l1"]["regressions"]:
        assert set(entry) == {"step", "ratio"}
        assert isinstance(entry["step"], int) and isinstance(entry["ratio"], float)
    for entry in doc["l2"]["stragglers"]:
        assert set(entry) == {"rank", "phase", "axis", "ratio", "z"} | COST
        assert isinstance(entry["rank"], int) and isinstance(entry["phase"], str)
        assert 0 < entry["cost_share"] <= 1 and entry["cost_s"] > 0
        assert entry["axis"] in ("dp", "tp", "pp", "ep")
    for entry in doc["l3"]["stragglers"]:
        assert set(entry) == {"rank", "kernel", "stream", "score"}
        assert isinstance(entry["stream"], int) and isinstance(entry["kernel"], str)
    for entry in doc["verdict"]:
        assert set(entry) == {"rank", "cause", "evidence"} | COST
        assert isinstance(entry["evidence"], str) and entry["evidence"]
        assert entry["cost_share"] >= 0.02 and "costs the job" in entry["evidence"]


def test_diagnose_json_finds_rank_5_compute_straggler(straggler_doc):
    """compute-straggler: the verdict is rank 5, cause compute, in attention and mlp from 15."""
    doc = straggler_doc
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(5, "compute")]
    assert {(s["rank"], s["phase"]) for s in doc["l2"]["stragglers"]} == \
        {(5, "attention"), (5, "mlp")}
    assert {s["rank"] for s in doc["l3"]["stragglers"]} == {5}
    assert [r["step"] for r in doc["l1"]["regressions"]] in ([14], [15], [16])
    assert doc["l1"]["spikes"] == []
    assert CASES["compute-straggler"].expect.mismatches(doc) == []


def test_diagnose_json_spike_entries_use_design_field_names(tmp_path, capsys):
    """L1 spikes (jit-stall case) are listed as {step, ratio} at the input's step numbers."""
    write_records(simulate(CASES["jit-stall"].config(seed=0)), tmp_path)
    doc = diagnose_json(capsys, str(tmp_path))
    assert [s["step"] for s in doc["l1"]["spikes"]] == [12, 27]
    for entry in doc["l1"]["spikes"]:
        assert set(entry) == {"step", "ratio"}
        assert entry["ratio"] > 1
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(3, "host")]


def test_diagnose_json_of_healthy_run_has_empty_lists(tmp_path, capsys):
    """A healthy run gives empty lists at every level (DESIGN.md: lists are empty)."""
    write_records(simulate(CASES["healthy"].config(seed=0, steps=STEPS)), tmp_path)
    doc = diagnose_json(capsys, str(tmp_path))
    assert doc["l1"] == {"spikes": [], "regressions": []}
    assert doc["l2"] == {"stragglers": [], "host": [], "links": []}
    assert doc["l3"] == {"stragglers": []}
    assert doc["verdict"] == [] and doc["minor"] == []


# --------------------------------------------------------------------------- diagnose text, plots


def test_diagnose_text_report_names_rank_5_and_compute(straggler_dir, capsys):
    """Without --json, the human report names rank 5 and the cause compute."""
    code, out, _ = run(capsys, "diagnose", str(straggler_dir))
    assert code == 0
    assert "rank 5" in out
    assert "compute" in out
    assert "compute-straggler" in out
    assert not out.lstrip().startswith("{")


def test_text_report_lists_kernel_stragglers_in_the_json_order(straggler_dir, straggler_doc,
                                                               capsys):
    """The L3 table of the text report and --json's l3.stragglers come in the same order."""
    code, out, _ = run(capsys, "diagnose", str(straggler_dir))
    assert code == 0
    kernels = {s["kernel"] for s in straggler_doc["l3"]["stragglers"]}
    in_text = [line.split()[1] for line in out.splitlines()
               if len(line.split()) == 4 and line.split()[1] in kernels]
    assert in_text == [s["kernel"] for s in straggler_doc["l3"]["stragglers"]]
    assert len(in_text) >= 3


def kernels_only(directory: Path, with_kernels: bool = True) -> Path:
    """A job of 8 ranks whose exporters sent identities (and kernels) but no step records."""
    import numpy as np
    import orjson

    rng = np.random.default_rng(0)
    lines = []
    for rank in range(8):
        lines.append({"v": 1, "kind": "rank", "job": "j", "rank": rank, "world_size": 8,
                      "host": "h", "coords": {"dp": rank}})
        if with_kernels:
            n = 2000
            lines.append({"v": 1, "kind": "kernels", "job": "j", "rank": rank,
                          "names": ["gemm"], "name": [0] * n, "stream": [7] * n,
                          "start_ns": (1_790_000_000_000_000_000 + np.arange(n) * 10**6).tolist(),
                          "dur_ns": rng.lognormal(np.log(5e4), 0.1, n).astype(int).tolist()})
    path = directory / "trace.ndjson"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def test_diagnose_without_step_records_never_says_healthy(tmp_path, capsys):
    """Kernels but no steps: L1 and L2 say they could not judge, the verdict is no verdict
    (not "healthy"), and --json lists what was not judged (it used to say healthy, exit 0)."""
    path = kernels_only(tmp_path)
    code, out, _ = run(capsys, "diagnose", str(path))
    assert code == 0
    assert "healthy:" not in out
    assert out.count("not judged: no step records") == 2
    assert "no verdict" in out and "not a clean bill of health" in out
    code, out, err = run(capsys, "diagnose", str(path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == []
    assert doc["not_judged"] == [{"level": "l1", "reason": "no step records"},
                                 {"level": "l2", "reason": "no step records"}]
    assert "L1 not judged: no step records" in err


def test_diagnose_with_nothing_to_judge_exits_3(tmp_path, capsys):
    """Identities only: nothing could be judged; exit status 3, and the report says what to
    record."""
    code, out, _ = run(capsys, "diagnose", str(kernels_only(tmp_path, with_kernels=False)))
    assert code == 3
    assert "nothing could be judged" in out and "healthy:" not in out


def test_healthy_run_is_still_called_healthy(tmp_path, capsys):
    """With steps and kernels for every rank and nothing found, the verdict is healthy."""
    write_records(simulate(CASES["healthy"].config(seed=0, steps=STEPS)), tmp_path)
    code, out, _ = run(capsys, "diagnose", str(tmp_path))
    assert code == 0 and "healthy: nothing to act on" in out and "not judged" not in out


def test_phase_heatmap_tells_25x_from_2x(tmp_path, capsys):
    """phases.png's colour scale reaches the largest ratio: a rank 25x slower is not drawn
    like one 2x slower (the scale used to stop at 2x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from argus_core.detect.diagnose import diagnose
    from argus_core.reader import load_traces
    from argus_core.report.plots import phase_figure

    code, _, err = run(capsys, "simulate", "--case", "custom", "--out", str(tmp_path),
                       "--steps", "30", "--topology", "dp=8",
                       "--fault", "compute:ranks=5:phases=mlp*25:from=0",
                       "--fault", "compute:ranks=2:phases=mlp*2:from=0")
    assert code == 0, err
    diagnosis = diagnose(load_traces([str(tmp_path)]).traces["custom"])
    fig = phase_figure(diagnosis, plt)
    image = fig.axes[0].images[0]
    colours = image.to_rgba(image.get_array())
    mlp = list(diagnosis.matrix.phase_names).index("mlp")
    row = {int(r): i for i, r in enumerate(diagnosis.matrix.ranks)}
    slow, slower, calm = (tuple(colours[row[r], mlp]) for r in (2, 5, 0))
    assert slow != slower != calm
    ratios = diagnosis.l2.ratios[:, mlp]
    assert ratios[row[5]] > 20 and 1.5 < ratios[row[2]] < 3
    plt.close(fig)


def test_diagnose_plot_writes_three_valid_pngs(straggler_dir, tmp_path, capsys):
    """--plot DIR writes iteration.png, phases.png and l3_scores.png as real PNG images."""
    plots = tmp_path / "plots"
    code, out, err = run(capsys, "diagnose", str(straggler_dir), "--json", "--plot", str(plots))
    assert code == 0
    assert json.loads(out)["job"] == "compute-straggler"  # --plot keeps stdout pure JSON
    for name in ("iteration.png", "phases.png", "l3_scores.png"):
        path = plots / name
        assert path.is_file(), name
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE, name
        assert len(data) > 5_000, name
        assert str(path) in err


# ---------------------------------------------------------------- diagnose input problems


def test_diagnose_skips_bad_lines_and_reports_them(straggler_dir, tmp_path, capsys):
    """Bad lines mixed into a trace: exit 0, the finding holds, stderr says skipped + line."""
    directory = tmp_path / "t"
    shutil.copytree(straggler_dir, directory)
    target = directory / "rank-00002.ndjson"
    good_lines = len(target.read_text().splitlines())
    with target.open("a") as handle:
        handle.write("{not json\n")
        handle.write('{"v": 1, "kind": "step", "job": "compute-straggler", "rank": 2, '
                     '"step": 99, "t_ns": 1, "wall_s": -1}\n')
    code, out, err = run(capsys, "diagnose", str(directory), "--json")
    assert code == 0
    assert "skipped 2 bad record(s)" in err
    assert f"{target}:{good_lines + 1}: json" in err
    assert f"{target}:{good_lines + 2}: wall_s" in err
    doc = json.loads(out)
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(5, "compute")]


def test_diagnose_warns_about_empty_file(straggler_dir, tmp_path, capsys):
    """An empty trace file is named in a warning; the diagnosis still runs (exit 0)."""
    directory = tmp_path / "t"
    shutil.copytree(straggler_dir, directory)
    (directory / "rank-00099.ndjson").write_text("")
    code, _, err = run(capsys, "diagnose", str(directory), "--json")
    assert code == 0
    assert "rank-00099.ndjson is empty" in err


def test_diagnose_warns_when_a_restarted_job_mixed_its_attempts(tmp_path, capsys):
    """The same job run twice into one spool (a restart numbering steps from 0 again): the
    report still comes, and stderr says which ranks repeated step numbers and what to do."""
    first = list(simulate(CASES["healthy"].config(seed=0, steps=STEPS)))
    later = [(rank, {**rec, "t_ns": rec["t_ns"] + 3600 * 10**9} if "t_ns" in rec else rec)
             for rank, rec in simulate(CASES["healthy"].config(seed=1, steps=STEPS))
             if rec["kind"] != "kernels"]
    write_records(first, tmp_path / "attempt-1")
    write_records(later, tmp_path / "attempt-2")
    code, _, err = run(capsys, "diagnose", str(tmp_path), "--json")
    assert code == 0
    assert "recorded the same step numbers at different times" in err
    assert "8 rank(s)" in err and ": 0-7;" in err


@pytest.fixture
def two_jobs(tmp_path) -> Path:
    write_records(simulate(CASES["compute-straggler"].config(seed=0, steps=STEPS)),
                  tmp_path / "a")
    write_records(simulate(CASES["healthy"].config(seed=0, steps=STEPS)), tmp_path / "b")
    return tmp_path


def test_diagnose_two_jobs_without_job_exits_2_naming_both(two_jobs, capsys):
    """An input with two jobs and no --job exits 2, names both jobs and suggests --job."""
    code, out, err = run(capsys, "diagnose", str(two_jobs))
    assert code == 2
    assert out == ""
    assert "compute-straggler" in err
    assert "healthy" in err
    assert "--job" in err


def test_diagnose_two_jobs_with_job_diagnoses_that_job(two_jobs, capsys):
    """--job picks one job out of a multi-job input."""
    doc = diagnose_json(capsys, str(two_jobs), "--job", "compute-straggler")
    assert doc["job"] == "compute-straggler"
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(5, "compute")]
    doc = diagnose_json(capsys, str(two_jobs), "--job", "healthy")
    assert doc["job"] == "healthy"
    assert doc["verdict"] == []


def test_diagnose_unknown_job_exits_2_listing_jobs(two_jobs, capsys):
    """--job naming a job not in the input exits 2 and lists the jobs that are there."""
    code, _, err = run(capsys, "diagnose", str(two_jobs), "--job", "nope")
    assert code == 2
    assert "'nope'" in err
    assert "compute-straggler" in err and "healthy" in err


def test_diagnose_nonexistent_path_exits_2(tmp_path, capsys):
    """A path that does not exist exits 2 with 'no such file' and the path."""
    missing = tmp_path / "missing-dir"
    code, out, err = run(capsys, "diagnose", str(missing))
    assert code == 2
    assert out == ""
    assert "no such file" in err
    assert str(missing) in err


def test_diagnose_input_with_no_valid_record_exits_2(tmp_path, capsys):
    """A trace with only bad lines exits 2 explaining there is nothing valid."""
    (tmp_path / "bad.ndjson").write_text("{oops\n")
    code, _, err = run(capsys, "diagnose", str(tmp_path))
    assert code == 2
    assert "no valid trace records" in err


def test_diagnose_reads_stdin(straggler_dir, monkeypatch, capsys):
    """`argus diagnose -` reads the trace from standard input."""
    data = b"".join(p.read_bytes() for p in sorted(straggler_dir.iterdir()))
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
    doc = diagnose_json(capsys, "-")
    assert [(v["rank"], v["cause"]) for v in doc["verdict"]] == [(5, "compute")]


# --------------------------------------------------------------------------- demo, version, script


def test_demo_diagnoses_every_case(capsys):
    """`argus demo` exits 0 and reports all 6 cases diagnosed as expected."""
    code, out, _ = run(capsys, "demo")
    assert code == 0
    assert "7/7 cases" in out


def test_version_prints_package_version(capsys):
    """`argus --version` prints 'argus <version>' and exits 0."""
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"argus {__version__}"


def test_no_subcommand_is_a_usage_error(capsys):
    """`argus` without a subcommand exits 2 with usage text."""
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "usage: argus" in capsys.readouterr().err


def test_console_script_runs_simulate_and_diagnose(tmp_path):
    """The installed `argus` console script works end to end as a subprocess."""
    assert ARGUS_SCRIPT.exists(), ARGUS_SCRIPT
    version = subprocess.run([str(ARGUS_SCRIPT), "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert version.returncode == 0
    assert version.stdout.strip() == f"argus {__version__}"
    out = tmp_path / "t"
    sim = subprocess.run([str(ARGUS_SCRIPT), "simulate", "--case", "compute-straggler", "--out",
                          str(out), "--steps", str(STEPS)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert sim.returncode == 0, sim.stderr
    diag = subprocess.run([str(ARGUS_SCRIPT), "diagnose", str(out), "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert diag.returncode == 0, diag.stderr
    assert [(v["rank"], v["cause"]) for v in json.loads(diag.stdout)["verdict"]] == \
        [(5, "compute")]
    missing = subprocess.run([str(ARGUS_SCRIPT), "diagnose", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode == 2
    assert "no such file" in missing.stderr


def test_python_dash_m_runs_the_cli():
    """`python -m argus_core.cli --version` runs the CLI (where the console script is absent)."""
    proc = subprocess.run([sys.executable, "-m", "argus_core.cli", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"argus {__version__}"


@pytest.mark.parametrize(("argv", "message"), [
    (["--interval", "nan"], "--interval"),
    (["--timeout", "nan"], "--timeout"),
    (["--window", "inf"], "--window"),
    (["--listen", "127.0.0.1:99999"], "expected HOST:PORT"),
])
def test_score_refuses_settings_that_are_not_finite_or_a_port(argv, message, capsys):
    """`argus score` with NaN/inf seconds or a port past 65535 exits 2 naming the flag (NaN
    passed its `> 0` check and ran, or died later with a traceback)."""
    code, _, err = run(capsys, "score", "--prometheus", "http://127.0.0.1:1", *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("window", ["0", "-5", "nan", "inf"])
def test_diagnose_refuses_a_window_that_is_not_positive_seconds(straggler_dir, window, capsys):
    """`--window 0`, `nan` or `inf` exits 2 naming --window (it was a traceback)."""
    code, _, err = run(capsys, "diagnose", str(straggler_dir), "--window", window)
    assert code == 2 and "--window" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--time-scale", "nan"], "--time-scale"),
    (["--time-scale", "-1"], "--time-scale"),
    (["--ranks", "0"], "--ranks"),
])
def test_stack_up_refuses_bad_numbers_before_starting_anything(tmp_path, argv, message, capsys):
    """`argus stack up` with a NaN or negative time scale, or no ranks, exits 2 naming the flag
    and starts nothing (a NaN time scale was a traceback, --ranks 0 was accepted)."""
    code, _, err = run(capsys, "stack", "up", "--workdir", str(tmp_path / "s"),
                       "--simulate", "healthy", *argv)
    assert code == 2 and message in err
    assert not (tmp_path / "s" / "stack.json").exists()


@pytest.mark.parametrize("expires", ["0", "-1", "604801"])
def test_traces_open_refuses_an_expiry_s3_would_not_honour(tmp_path, expires, capsys):
    """`argus traces open --expires` takes what the processor's ARGUS_TRACE_LINK_EXPIRES_S
    takes (1 to 604800 s, S3's limit); it printed links that were dead on arrival."""
    code, out, err = run(capsys, "traces", "open", "--store", f"file://{tmp_path}",
                         "--job", "j", "--rank", "1", "--expires", expires, "--at", "5m", "ago")
    assert code == 2 and "--expires" in err and not out


def test_stack_status_marks_what_is_not_running(tmp_path, capsys):
    """`argus stack status` on a stack whose processor died: its URL is flagged, the exit
    code is 1 and stderr names it; --json keeps the five-URL contract (plus the sink and the
    targets folder)."""
    me = os.getpid()
    urls = {n: f"http://127.0.0.1:{9000 + i}" for i, n in
            enumerate(("prometheus", "alertmanager", "processor", "scorer", "s3"))}
    processes = [Process(n, me, _start_time(me), ["x"], str(tmp_path / f"{n}.log"), urls[n])
                 for n in urls if n != "processor"]
    processes.append(Process("processor", me, -1, ["x"], str(tmp_path / "p.log"),
                             urls["processor"]))  # -1: not this pid's start time, so dead
    Stack(tmp_path, urls, processes, {}).save()
    assert main(["stack", "status", "--workdir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["processor"].endswith("(not running)")
    assert not lines["scorer"].endswith("(not running)")
    assert "not running: processor" in err
    assert main(["stack", "status", "--workdir", str(tmp_path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {
        **urls, "sink": urls["processor"] + "/v1/records", "targets": str(tmp_path / "targets")}


def test_stack_targets_writes_what_prometheus_discovers(tmp_path, capsys):
    """`argus stack targets` writes a real job's ranks as a file_sd file (a port range and
    extra targets), replaces it on the next call, removes it with none, and refuses a bad
    target or range naming it."""
    Stack(tmp_path, {}, [], {}).save()
    (tmp_path / "targets").mkdir()
    assert main(["stack", "targets", "--workdir", str(tmp_path), "--job", "ddp",
                 "--ports", "9100-9102", "10.0.0.5:9200"]) == 0
    path = tmp_path / "targets" / "ddp.json"
    groups = json.loads(path.read_text())
    assert groups == [{"targets": ["127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102",
                                   "10.0.0.5:9200"], "labels": {"argus_job": "ddp"}}]
    assert main(["stack", "targets", "--workdir", str(tmp_path), "--job", "ddp",
                 "--ports", "9300"]) == 0
    assert json.loads(path.read_text())[0]["targets"] == ["127.0.0.1:9300"]
    assert main(["stack", "targets", "--workdir", str(tmp_path), "--job", "ddp"]) == 0
    assert not path.exists()
    capsys.readouterr()
    assert main(["stack", "targets", "--workdir", str(tmp_path), "--job", "ddp",
                 "nohost"]) == 2
    assert "target 'nohost': expected HOST:PORT" in capsys.readouterr().err
    assert main(["stack", "targets", "--workdir", str(tmp_path), "--job", "ddp",
                 "--ports", "9105-9100"]) == 2
    assert "--ports '9105-9100'" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_the_output_quietly():
    """``argus diagnose --json | head -c 10``: a pipe closed by its reader ends the command
    with status 141 (as a shell would), with no traceback."""
    recording = Path(__file__).parent / "data" / "real_jobs" / "healthy-8.ndjson.gz"
    proc = subprocess.Popen([sys.executable, "-m", "argus_core.cli", "diagnose", "--json",
                             str(recording)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the document is written
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr
