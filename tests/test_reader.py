"""Reading trace inputs: ``argus_core.reader.load_traces`` (files, directories, .gz, stdin)."""

from __future__ import annotations

import gzip
import io
import json
import types
from pathlib import Path

import numpy as np
import pytest

from argus_core.reader import MAX_KEPT_REJECTS, InputError, load_traces
from argus_core.simulate import CASES, simulate, write_records

STEPS = 5


def simulated(case: str = "compute-straggler", steps: int = STEPS) -> list[tuple[int, dict]]:
    """The (rank, record) pairs of a short simulation of one preset case."""
    return list(simulate(CASES[case].config(seed=0, steps=steps)))


def count(records: list[tuple[int, dict]], kind: str) -> int:
    """Number of records of one kind."""
    return sum(rec["kind"] == kind for _, rec in records)


def kernel_count(records: list[tuple[int, dict]]) -> int:
    """Number of kernel executions in all kernels batches."""
    return sum(len(rec["name"]) for _, rec in records if rec["kind"] == "kernels")


def line(**rec) -> str:
    """One NDJSON line."""
    return json.dumps(rec)


def rank_rec(rank: int, job: str = "j", world_size: int = 4) -> str:
    return line(v=1, kind="rank", job=job, rank=rank, world_size=world_size,
                coords={"dp": rank})


def step_rec(rank: int, step: int, wall_s: float = 0.5, job: str = "j") -> str:
    return line(v=1, kind="step", job=job, rank=rank, step=step, t_ns=1_000 * step,
                wall_s=wall_s, gpu_s=wall_s * 0.9, phases={"mlp": wall_s / 2})


def kernels_rec(rank: int, dur_ns=(10, 20, 30), job: str = "j", **override) -> str:
    rec = {"v": 1, "kind": "kernels", "job": job, "rank": rank, "names": ["gemm", "nccl"],
           "name": [0, 1, 0], "stream": [7, 13, 7], "start_ns": [100, 200, 300],
           "dur_ns": list(dur_ns)}
    rec.update(override)
    return json.dumps(rec)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{text}\n" for text in lines))
    return path


@pytest.fixture(scope="module")
def sim_records() -> list[tuple[int, dict]]:
    return simulated()


@pytest.fixture
def sim_dir(tmp_path, sim_records) -> Path:
    directory = tmp_path / "trace"
    write_records(sim_records, directory)
    return directory


def assert_same_trace(a, b):
    """Two traces hold identical steps, kernels and rank identities."""
    assert a.job == b.job
    assert a.ranks == b.ranks
    assert a.rank_ids.tolist() == b.rank_ids.tolist()
    for column in ("rank", "step", "t_ns", "wall_s", "gpu_s", "phases"):
        np.testing.assert_array_equal(getattr(a.steps, column), getattr(b.steps, column))
    assert a.steps.phase_names == b.steps.phase_names
    for column in ("rank", "stream", "start_ns", "dur_ns"):
        np.testing.assert_array_equal(getattr(a.kernels, column), getattr(b.kernels, column))
    assert [a.kernels.names[i] for i in a.kernels.name] == \
        [b.kernels.names[i] for i in b.kernels.name]
    assert len(a.stacks) == len(b.stacks)


# --------------------------------------------------------------------------- simulator output


def test_simulated_directory_loads_one_trace_with_all_ranks_steps_kernels(sim_dir, sim_records):
    """A directory of per-rank files loads as one job with every rank, step and kernel."""
    result = load_traces([sim_dir])
    assert list(result.traces) == ["compute-straggler"]
    trace = result.traces["compute-straggler"]
    world = CASES["compute-straggler"].topology.world_size
    assert trace.rank_ids.tolist() == list(range(world))
    assert sorted(trace.ranks) == list(range(world))
    assert len(trace.steps) == world * STEPS
    assert sorted(set(trace.steps.step.tolist())) == list(range(STEPS))
    assert len(trace.kernels) == kernel_count(sim_records)
    assert len(trace.stacks) == count(sim_records, "stack")
    assert result.records == len(sim_records)
    assert result.rejects == []
    assert result.rejected == 0
    assert result.empty_sources == []


def test_kernel_columns_match_what_the_simulator_wrote(sim_dir, sim_records):
    """Kernel timestamps (beyond 2**53 ns) and durations arrive unchanged, rank by rank."""
    trace = load_traces([sim_dir]).traces["compute-straggler"]
    for rank in (0, 5):
        batches = [rec for r, rec in sim_records if r == rank and rec["kind"] == "kernels"]
        mask = trace.kernels.rank == rank
        expected_start = np.concatenate([np.asarray(b["start_ns"]) for b in batches])
        expected_dur = np.concatenate([np.asarray(b["dur_ns"]) for b in batches])
        assert trace.kernels.start_ns[mask].tolist() == expected_start.tolist()
        assert trace.kernels.dur_ns[mask].tolist() == expected_dur.tolist()
        names = [trace.kernels.names[i] for i in trace.kernels.name[mask]]
        assert names == [b["names"][i] for b in batches for i in b["name"]]


def test_directory_with_two_jobs_gives_two_traces(tmp_path):
    """Jobs are kept apart: two simulated jobs under one directory load as two traces."""
    write_records(simulated("compute-straggler", steps=3), tmp_path / "a")
    write_records(simulated("healthy", steps=4), tmp_path / "b")
    result = load_traces([tmp_path])
    assert sorted(result.traces) == ["compute-straggler", "healthy"]
    assert len(result.traces["compute-straggler"].steps) == 8 * 3
    assert len(result.traces["healthy"].steps) == 8 * 4


def test_several_paths_are_read_together(sim_dir):
    """Files given one by one load the same as their directory."""
    files = sorted(sim_dir.iterdir())
    assert_same_trace(load_traces(files).traces["compute-straggler"],
                      load_traces([sim_dir]).traces["compute-straggler"])


def test_directory_ignores_files_that_are_not_traces(sim_dir):
    """Only *.ndjson/*.jsonl/*.json[.gz] are read from directories; other files are ignored."""
    (sim_dir / "README.txt").write_text("not a trace\n")
    (sim_dir / "core.dump").write_bytes(b"\x00\x01garbage")
    result = load_traces([sim_dir])
    assert result.rejected == 0
    assert result.empty_sources == []


# --------------------------------------------------------------------------- gzip and stdin


def test_gzipped_rank_file_reads_the_same_as_plain(sim_dir):
    """A gzip-compressed rank file (.ndjson.gz) loads exactly like the uncompressed one."""
    plain = load_traces([sim_dir]).traces["compute-straggler"]
    for path in sorted(sim_dir.glob("*.ndjson"))[::2]:
        gz = path.with_name(path.name + ".gz")
        gz.write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    assert any(sim_dir.glob("*.gz"))
    mixed = load_traces([sim_dir])
    assert mixed.rejected == 0
    assert_same_trace(mixed.traces["compute-straggler"], plain)


def test_simulator_gzip_output_reads_the_same_as_plain(tmp_path, sim_records):
    """write_records(compress=True) output loads identically to the plain files."""
    write_records(sim_records, tmp_path / "plain")
    write_records(sim_records, tmp_path / "gz", compress=True)
    assert all(p.name.endswith(".ndjson.gz") for p in (tmp_path / "gz").iterdir())
    assert_same_trace(load_traces([tmp_path / "gz"]).traces["compute-straggler"],
                      load_traces([tmp_path / "plain"]).traces["compute-straggler"])


def test_gzip_is_detected_by_content_when_named_explicitly(tmp_path):
    """A gzip file passed by name is decompressed even without a .gz suffix."""
    path = tmp_path / "trace.ndjson"
    path.write_bytes(gzip.compress(f"{rank_rec(0)}\n{step_rec(0, 1)}\n".encode()))
    result = load_traces([path])
    assert result.records == 2
    assert result.traces["j"].steps.step.tolist() == [1]


def test_dash_reads_stdin(monkeypatch, sim_dir):
    """The path '-' reads NDJSON from standard input (its binary buffer)."""
    data = b"".join(p.read_bytes() for p in sorted(sim_dir.iterdir()))
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
    from_stdin = load_traces(["-"])
    assert from_stdin.rejected == 0
    assert_same_trace(from_stdin.traces["compute-straggler"],
                      load_traces([sim_dir]).traces["compute-straggler"])


def test_stdin_rejects_are_reported_with_source_dash(monkeypatch):
    """Bad lines read from stdin are reported against source '-' with their line number."""
    data = f"{rank_rec(0)}\nnot json\n{step_rec(0, 0)}\n".encode()
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
    result = load_traces(["-"])
    assert [(r.source, r.line, r.field) for r in result.rejects] == [("-", 2, "json")]
    assert result.records == 2


def test_gzip_on_stdin_is_decompressed(monkeypatch):
    """'-' fed a gzip stream (``cat spool/*.ndjson.gz | argus diagnose -``) reads its records."""
    data = gzip.compress(f"{rank_rec(0)}\n{step_rec(0, 1)}\n".encode())
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
    result = load_traces(["-"])
    assert result.rejected == 0
    assert result.traces["j"].steps.step.tolist() == [1]


def test_truncated_gzip_keeps_its_lines_and_the_other_files(tmp_path):
    """A .gz cut short (a job killed mid-write, a partial copy) is a reject naming the file, not
    a crash: its complete lines and every other file still load."""
    good = tmp_path / "rank-0.ndjson"
    write_lines(good, [rank_rec(0), step_rec(0, 0)])
    lines = [rank_rec(1)] + [step_rec(1, step) for step in range(400)]
    whole = gzip.compress("".join(f"{text}\n" for text in lines).encode())
    (tmp_path / "rank-1.ndjson.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "rank-2.ndjson.gz").write_bytes(b"\x1f\x8bnot a gzip stream")
    result = load_traces([tmp_path])
    steps = result.traces["j"].steps
    assert sorted(set(steps.rank.tolist())) == [0, 1]
    assert 0 < int((steps.rank == 1).sum()) < 400
    assert {r.source.rsplit("/", 1)[-1] for r in result.rejects if r.field == "gzip"} == {
        "rank-1.ndjson.gz", "rank-2.ndjson.gz"}


# --------------------------------------------------------------------------- bad lines


@pytest.fixture
def mixed_file(tmp_path) -> Path:
    return write_lines(tmp_path / "mixed.ndjson", [
        rank_rec(0),                                           # 1 ok
        '{"v": 1, "kind": "step", "job": "j", ',               # 2 malformed JSON
        step_rec(0, 0, wall_s=0.5),                            # 3 ok
        "",                                                    # 4 blank: ignored
        line(v=1, kind="metrics", job="j", rank=0),            # 5 unknown kind
        kernels_rec(0, dur_ns=(10, 20)),                       # 6 column lengths differ
        kernels_rec(0, dur_ns=(10, 20, 30)),                   # 7 ok
        kernels_rec(0, dur_ns=(10, 20, -30)),                  # 8 negative duration
        step_rec(1, 0, wall_s=0.6),                            # 9 ok
        "[1, 2, 3]",                                           # 10 not an object
    ])


def test_bad_lines_are_rejected_and_valid_ones_kept(mixed_file):
    """Every valid line of a file with bad lines in it is loaded; bad ones do not take it down."""
    result = load_traces([mixed_file])
    assert result.records == 4
    trace = result.traces["j"]
    assert trace.rank_ids.tolist() == [0, 1]
    assert sorted(zip(trace.steps.rank.tolist(), trace.steps.wall_s.tolist(), strict=True)) == \
        [(0, 0.5), (1, 0.6)]
    assert trace.kernels.dur_ns.tolist() == [10, 20, 30]


def test_each_bad_line_is_reported_with_line_number_and_field(mixed_file):
    """Each reject names its file, its 1-based line number (blank lines counted) and field."""
    result = load_traces([mixed_file])
    assert [(r.source, r.line, r.field) for r in result.rejects] == [
        (str(mixed_file), 2, "json"),
        (str(mixed_file), 5, "kind"),
        (str(mixed_file), 6, "kernels"),
        (str(mixed_file), 8, "dur_ns[2]"),
        (str(mixed_file), 10, "record"),
    ]
    reasons = [r.reason for r in result.rejects]
    assert "malformed JSON" in reasons[0]
    assert "metrics" in reasons[1]
    assert "different lengths" in reasons[2]
    assert "-30" in reasons[3]
    assert str(result.rejects[3]).startswith(f"{mixed_file}:8: dur_ns[2]: ")


def test_reject_counts_group_by_field(mixed_file):
    """reject_counts counts rejects per field (array index dropped) and sums to rejected."""
    result = load_traces([mixed_file])
    assert dict(result.reject_counts) == {"json": 1, "kind": 1, "kernels": 1, "dur_ns": 1,
                                          "record": 1}
    assert result.rejected == 5


def test_rejects_kept_are_capped_but_all_are_counted(tmp_path):
    """A flood of bad lines keeps a bounded list of examples but counts every one."""
    bad = MAX_KEPT_REJECTS + 25
    write_lines(tmp_path / "flood.ndjson", [rank_rec(0)] + ["{oops"] * bad)
    result = load_traces([tmp_path])
    assert len(result.rejects) == MAX_KEPT_REJECTS
    assert result.rejected == bad
    assert result.reject_counts["json"] == bad
    assert result.records == 1


def test_bad_kernel_column_next_to_large_timestamps_is_only_a_reject(tmp_path):
    """A kernels line with text among >2**53 timestamps is rejected; the rest still loads."""
    path = write_lines(tmp_path / "t.ndjson", [
        rank_rec(0),
        kernels_rec(0, start_ns=[2**60, "1e3", 2**60 + 5]),
        step_rec(0, 0),
    ])
    result = load_traces([path])
    assert result.records == 2
    assert [(r.line, r.field) for r in result.rejects] == [(2, "start_ns[1]")]


# --------------------------------------------------------------------------- empty / nothing


def test_empty_file_among_valid_files_is_listed_and_rest_loads(sim_dir):
    """An empty rank file is reported in empty_sources; the other files still load."""
    empty = sim_dir / "rank-99999.ndjson"
    empty.write_text("")
    blank = sim_dir / "rank-99998.ndjson"
    blank.write_text("\n  \n")
    result = load_traces([sim_dir])
    assert sorted(result.empty_sources) == sorted([str(empty), str(blank)])
    assert result.traces["compute-straggler"].rank_ids.tolist() == list(range(8))
    assert result.rejected == 0


def test_only_an_empty_file_raises_input_error(tmp_path):
    """A directory holding just an empty trace file is an InputError naming that file."""
    empty = tmp_path / "rank-00000.ndjson"
    empty.write_text("")
    with pytest.raises(InputError, match="no valid trace records") as info:
        load_traces([tmp_path])
    assert str(empty) in str(info.value)


def test_only_bad_lines_raises_input_error_with_first_problem(tmp_path):
    """A directory with no valid line is an InputError quoting the first bad line."""
    path = write_lines(tmp_path / "bad.ndjson", [
        line(v=1, kind="metrics", job="j", rank=0),
        "{broken",
    ])
    with pytest.raises(InputError) as info:
        load_traces([tmp_path])
    message = str(info.value)
    assert "no valid trace records" in message
    assert f"{path}:1: kind" in message
    assert "unknown kind" in message


def test_directory_without_trace_files_raises_input_error(tmp_path):
    """A directory with no *.ndjson/*.jsonl/*.json files says no trace files were found."""
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(InputError, match="no trace files found"):
        load_traces([tmp_path])


def test_missing_path_raises_input_error_naming_it(tmp_path):
    """A path that does not exist is an InputError naming the path."""
    missing = tmp_path / "nope" / "rank-0.ndjson"
    with pytest.raises(InputError, match="no such file") as info:
        load_traces([missing])
    assert str(missing) in str(info.value)


def test_missing_path_among_valid_ones_still_raises(sim_dir, tmp_path):
    """A typo in one of several paths is reported, not silently skipped."""
    with pytest.raises(InputError, match="no such file"):
        load_traces([sim_dir, tmp_path / "typo"])


# --------------------------------------------------------------------------- trace content


def test_duplicate_step_counts_once_and_last_copy_wins(tmp_path):
    """A (rank, step) sent twice, e.g. by a retried upload, counts once with the later values."""
    path = write_lines(tmp_path / "dup.ndjson", [
        step_rec(0, 0, wall_s=0.5),
        step_rec(0, 1, wall_s=0.5),
        step_rec(1, 1, wall_s=0.7),
        step_rec(0, 1, wall_s=0.9),   # resend of rank 0 step 1 with new values
        step_rec(0, 2, wall_s=0.5),
    ])
    steps = load_traces([path]).traces["j"].steps
    rows = sorted(zip(steps.rank.tolist(), steps.step.tolist(), steps.wall_s.tolist(),
                      strict=True))
    assert rows == [(0, 0, 0.5), (0, 1, 0.9), (0, 2, 0.5), (1, 1, 0.7)]
    (row,) = np.flatnonzero((steps.rank == 0) & (steps.step == 1))
    assert steps.phases[row, steps.phase_names.index("mlp")] == pytest.approx(0.45)


def test_a_restarted_process_keeps_its_latest_steps_and_is_counted(tmp_path):
    """A job restarted into the same spool numbers its steps from 0 again: a step number seen
    at two different times is the later attempt's (whatever order the files are read in), and
    the trace counts such steps per rank so the user is told the attempts mixed."""
    def at(rank, step, t_s, wall_s):
        return line(v=1, kind="step", job="j", rank=rank, step=step, t_ns=t_s * 10**9,
                    wall_s=wall_s, gpu_s=wall_s * 0.9, phases={"mlp": wall_s / 2})

    write_lines(tmp_path / "a-second-attempt.ndjson",
                [at(0, step, 2000 + step, 0.9) for step in range(3)])
    write_lines(tmp_path / "b-first-attempt.ndjson",
                [at(0, step, 1000 + step, 0.5) for step in range(5)]
                + [at(1, step, 1000 + step, 0.5) for step in range(5)])
    trace = load_traces([tmp_path]).traces["j"]
    rows = sorted(zip(trace.steps.rank.tolist(), trace.steps.step.tolist(),
                      trace.steps.wall_s.tolist(), strict=True))
    assert rows[:5] == [(0, 0, 0.9), (0, 1, 0.9), (0, 2, 0.9), (0, 3, 0.5), (0, 4, 0.5)]
    assert trace.restarted_steps == {0: 3}


def test_duplicate_step_across_files_counts_once(tmp_path):
    """The same step delivered in two files is one row; the file read later wins."""
    write_lines(tmp_path / "a.ndjson", [step_rec(0, 3, wall_s=0.5)])
    write_lines(tmp_path / "b.ndjson", [step_rec(0, 3, wall_s=0.8)])
    steps = load_traces([tmp_path]).traces["j"].steps
    assert steps.step.tolist() == [3]
    assert steps.wall_s.tolist() == [0.8]


def test_rank_without_step_records_is_in_rank_ids(tmp_path):
    """Ranks known only from rank or kernels records still appear in trace.rank_ids."""
    path = write_lines(tmp_path / "t.ndjson", [
        rank_rec(0), rank_rec(1), rank_rec(2),
        step_rec(0, 0),
        kernels_rec(3),      # kernels but no rank record and no steps
    ])
    trace = load_traces([path]).traces["j"]
    assert trace.rank_ids.tolist() == [0, 1, 2, 3]
    assert trace.steps.rank.tolist() == [0]


def test_job_with_only_rank_records_still_loads(tmp_path):
    """A job that has announced its ranks but sent no steps yet loads with empty tables."""
    path = write_lines(tmp_path / "t.ndjson", [rank_rec(0), rank_rec(1)])
    trace = load_traces([path]).traces["j"]
    assert trace.rank_ids.tolist() == [0, 1]
    assert len(trace.steps) == 0
    assert len(trace.kernels) == 0


def test_rank_with_only_stack_samples_is_in_rank_ids(tmp_path):
    """A rank that sent only stack samples (e.g. a hung rank) is listed in rank_ids."""
    path = write_lines(tmp_path / "t.ndjson", [
        step_rec(0, 0),
        line(v=1, kind="stack", job="j", rank=3, t_ns=1, thread="MainThread", frames=["a"]),
    ])
    assert load_traces([path]).traces["j"].rank_ids.tolist() == [0, 3]


def test_latest_rank_identity_wins(tmp_path):
    """When a rank re-announces itself (e.g. after a restart) its latest identity is kept."""
    path = write_lines(tmp_path / "t.ndjson", [
        line(v=1, kind="rank", job="j", rank=1, world_size=4, host="node-a"),
        line(v=1, kind="rank", job="j", rank=1, world_size=4, host="node-b"),
    ])
    assert load_traces([path]).traces["j"].ranks[1].host == "node-b"


def test_progress_callback_reports_bytes_read(sim_dir):
    """The progress callback receives the byte count of every line read."""
    seen = []
    load_traces([sim_dir], progress=seen.append)
    assert sum(seen) == sum(p.stat().st_size for p in sim_dir.iterdir())


# -- many small kernel batches, parsed in bulk ------------------------------------------------
def small_batches(count: int, names_variants: int = 3, job: str = "j") -> list[str]:
    """``count`` kernels lines of 1-4 kernels each, several distinct ``names`` lists."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        names = [f"k{(i % names_variants) + j}" for j in range(3)]
        n = int(rng.integers(1, 5))
        out.append(line(v=1, kind="kernels", job=job, rank=i % 4, names=names,
                        name=rng.integers(0, 3, n).tolist(), stream=[7] * n,
                        start_ns=(10**18 + i * 1000 + np.arange(n)).tolist(),
                        dur_ns=rng.integers(1, 10**6, n).tolist()))
    return out


def test_many_small_batches_load_as_parsed_one_by_one(tmp_path):
    """Thousands of small batches (bulk path) give exactly the kernels that parsing each
    record on its own gives: same executions, names resolved through each line's list."""
    from argus_core.schema import parse_record
    from argus_core.trace import TraceBuilder

    lines = small_batches(10_000)
    result = load_traces([write_lines(tmp_path / "k.ndjson", [rank_rec(0), *lines])])
    bulk = result.traces["j"].kernels
    builder = TraceBuilder()
    for text in lines:
        builder.add(parse_record(json.loads(text)))
    one_by_one = builder.finish()["j"].kernels
    assert result.records == 10_001 and result.rejected == 0

    def rows(k):
        return sorted(zip(k.rank.tolist(), [k.names[i] for i in k.name], k.stream.tolist(),
                          k.start_ns.tolist(), k.dur_ns.tolist(), strict=True))

    assert rows(bulk) == rows(one_by_one)


def test_a_bad_batch_among_many_is_rejected_alone(tmp_path):
    """One bad kernels line inside a group of good ones: that line is rejected with its line
    number and field; every other batch of the group is kept."""
    lines = small_batches(3000)
    bad = json.loads(lines[1500])
    bad["dur_ns"][0] = -7
    lines[1500] = json.dumps(bad)
    lines[2000] = lines[2000].replace('"names": [', '"names": [1, ')
    result = load_traces([write_lines(tmp_path / "k.ndjson", lines)])
    assert [(r.line, r.field) for r in result.rejects] == [(1501, "dur_ns[0]"), (2001, "names")]
    expected = sum(len(json.loads(t)["name"]) for i, t in enumerate(lines)
                   if i not in (1500, 2000))
    assert len(result.traces["j"].kernels) == expected and result.records == 2998
