"""Every collective timed, whatever the parallelism (``argus_exporters.collectives``).

Real gloo jobs on CPU (``tests/scripts/parallel_train.py`` through ``bench/real_jobs.py``):
DDP, FSDP2, DTensor tensor parallel, a send/recv pipeline and an all-to-all MoE layer, each
healthy, with a late rank and with a slow one, must get exactly the faulty rank and cause and
nothing on the ranks that waited for it; compiled models too, without graph breaks of Argus's
own. The interval arithmetic (waits taken out of the phase they fell in) is checked on a clock
the test drives, and the hooks themselves in a one-rank gloo process.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import free_port

from argus_core.reader import load_traces
from argus_core.taxonomy import is_comm_phase, phase_axis
from argus_exporters.clock import HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import Tracer

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("real_jobs", ROOT / "bench" / "real_jobs.py")
real_jobs = importlib.util.module_from_spec(_spec)
sys.path.insert(0, str(ROOT / "bench"))
sys.modules["real_jobs"] = real_jobs
_spec.loader.exec_module(real_jobs)
# Fresh in the suite: every parallelism eager (compiled jobs are re-read from their
# recordings in test_real_jobs, and run fresh in the graph-break test below).
PARALLEL_CASES = [c for c in real_jobs.CASES if c.script == real_jobs.PARALLEL_SCRIPT
                  and "ARGUS_TEST_COMPILE" not in c.env
                  and (not c.name.startswith("pp4") or c.name == "pp4-link-4")]
# (the four-stage pipeline's other cases run from their recordings, tests/test_real_jobs.py)
IDENTITY = RankIdentity("job", 0, 1, 0, "node-0", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
STEPS = 40


class DrivenClock(HostClock):
    """A host clock whose time (ms) and current stream the test sets."""

    def __init__(self):
        self.now_ms = 0.0
        self.stream = 0

    def mark(self, stream=None) -> int:
        return int(self.now_ms * 1e6)

    def stream_key(self, stream=None) -> int:
        return self.stream


def _one_step(tmp_path, script) -> dict:
    """Run ``script(tracer, clock)`` as one step; the step record's phases in ms."""
    clock = DrivenClock()
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05), IDENTITY,
                    clock=clock)
    script(tracer, clock)
    tracer.step()
    tracer.shutdown()
    trace = load_traces([tmp_path]).traces["job"]
    names = trace.steps.phase_names
    return {n: round(float(trace.steps.phases[0, i]) * 1e3, 6) for i, n in enumerate(names)
            if trace.steps.phases[0, i] == trace.steps.phases[0, i]}


def _at(clock, ms):
    clock.now_ms = ms


def test_a_synchronous_collective_inside_forward_is_taken_out_of_it(tmp_path):
    """FSDP's all-gather in forward: forward counts its own 7 ms, the all-gather its 3."""
    def script(tracer, clock):
        forward = tracer.begin_phase("forward")
        _at(clock, 2)
        gather = tracer.begin_phase("dp-allgather", collective=True)
        _at(clock, 5)
        tracer.end_collective(gather)
        _at(clock, 10)
        tracer.end_phase(forward)

    assert _one_step(tmp_path, script) == {"forward": 7.0, "dp-allgather": 3.0}


@pytest.mark.parametrize("wait_mark", ["clock", "mark_now", "wait_mark"])
def test_an_async_collective_costs_forward_only_its_wait(tmp_path, wait_mark):
    """Issued at 2 ms, computed over until 6, waited for until 8: forward loses the 2 ms
    wait, the collective lasts from issue to the end of its wait; the wait's mark taken
    with the clock, with the tracer's ``mark_now`` (the hooks': it follows a clock that is
    not the plain host clock) or with ``wait_mark``."""
    def script(tracer, clock):
        forward = tracer.begin_phase("forward")
        _at(clock, 2)
        gather = tracer.begin_collective("dp-allgather")
        _at(clock, 6)
        waited_from = {"clock": clock.mark, "mark_now": tracer.mark_now,
                       "wait_mark": lambda: tracer.wait_mark(gather)}[wait_mark]()
        _at(clock, 8)
        tracer.end_collective(gather, waited_from)
        _at(clock, 10)
        tracer.end_phase(forward)

    assert _one_step(tmp_path, script) == {"forward": 8.0, "dp-allgather": 6.0}


def test_overlapping_collectives_of_one_name_last_their_union(tmp_path):
    """Two all-reduces in flight together (2-6 and 4-9 ms) and one later (12-13): 8 ms, not
    the 10 their sum would say."""
    def script(tracer, clock):
        _at(clock, 2)
        first = tracer.begin_phase("tp-allreduce", collective=True)
        _at(clock, 4)
        second = tracer.begin_phase("tp-allreduce", collective=True)
        _at(clock, 6)
        tracer.end_collective(first)
        _at(clock, 9)
        tracer.end_collective(second)
        _at(clock, 12)
        third = tracer.begin_phase("tp-allreduce", collective=True)
        _at(clock, 13)
        tracer.end_collective(third)

    assert _one_step(tmp_path, script) == {"tp-allreduce": 8.0}


def test_sends_and_recvs_keep_their_time_per_peer(tmp_path):
    """A pipeline stage sends to rank 3 twice (2-4 ms, and 3-7 ms overlapping it: isends in
    flight together) and receives from rank 1 once (8-9 ms): per peer its time (the union),
    its messages and the shortest one; the phases are every peer's together."""
    def script(tracer, clock):
        _at(clock, 2)
        first = tracer.begin_phase("pp-send", collective=True, peer=3)
        _at(clock, 3)
        second = tracer.begin_phase("pp-send", collective=True, peer=3)
        _at(clock, 4)
        tracer.end_collective(first)
        _at(clock, 7)
        tracer.end_collective(second)
        _at(clock, 8)
        recv = tracer.begin_phase("pp-recv", collective=True, peer=1)
        _at(clock, 9)
        tracer.end_collective(recv)

    assert _one_step(tmp_path, script) == {"pp-send": 5.0, "pp-recv": 1.0}
    trace = load_traces([tmp_path]).traces["job"]
    peers = trace.steps.peers
    names = trace.steps.phase_names
    got = {(names[phase], int(peer)): (round(s * 1e3, 6), int(n), round(m * 1e3, 6))
           for phase, peer, s, n, m in zip(peers.phase, peers.peer, peers.seconds, peers.count,
                                           peers.shortest_s, strict=True)}
    assert got == {("pp-send", 3): (5.0, 2, 2.0), ("pp-recv", 1): (1.0, 1, 1.0)}


def test_a_collective_on_another_stream_is_not_taken_out_of_forward(tmp_path):
    """A prefetching all-gather on its own stream overlaps forward's compute without
    blocking it: forward keeps its 10 ms."""
    def script(tracer, clock):
        forward = tracer.begin_phase("forward")
        clock.stream = 7
        _at(clock, 1)
        gather = tracer.begin_phase("dp-allgather", collective=True)
        _at(clock, 4)
        tracer.end_collective(gather)
        clock.stream = 0
        _at(clock, 10)
        tracer.end_phase(forward)

    assert _one_step(tmp_path, script) == {"forward": 10.0, "dp-allgather": 3.0}


def test_a_step_that_never_closes_holds_a_bounded_number_of_intervals(tmp_path):
    """Collectives with no optimizer step to close the step (an evaluation loop): the step
    keeps at most MAX_INTERVALS_PER_STEP intervals, the rest are dropped and counted."""
    from argus_exporters.tracer import MAX_INTERVALS_PER_STEP

    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05), IDENTITY,
                    clock=DrivenClock())
    extra = 1000
    for _ in range(MAX_INTERVALS_PER_STEP + extra):
        tracer.end_collective(tracer.begin_phase("dp-allreduce", collective=True))
    assert len(tracer._current.phases) == MAX_INTERVALS_PER_STEP
    assert tracer.health.dropped["step_intervals_full"] == extra
    tracer.shutdown()


def test_a_collective_lasts_until_its_end_not_until_its_steps_close(tmp_path):
    """On the host clock a collective's interval ends where ``end_collective`` was called,
    however later its step closes."""
    def script(tracer, clock):
        _at(clock, 1)
        token = tracer.begin_phase("dp-allreduce", collective=True)
        _at(clock, 3)
        tracer.end_collective(token)
        _at(clock, 9)

    assert _one_step(tmp_path, script) == {"dp-allreduce": 2.0}


def test_the_operations_the_exporters_name_are_communication():
    """``pg-send`` and ``world-alltoall`` are collectives (no axis); ``tp-allreduce`` is on tp."""
    assert is_comm_phase("pg-send") and phase_axis("pg-send") is None
    assert is_comm_phase("world-alltoall") and is_comm_phase("pp-recv")
    assert phase_axis("tp-allreduce") == "tp" and not is_comm_phase("forward")
    from argus_core.taxonomy import COLLECTIVE_OPS
    from argus_exporters.collectives import OPS

    assert COLLECTIVE_OPS == OPS  # the core knows every name the exporters give


ONE_RANK_START = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/pg", rank=0,
                            world_size=1)
    import argus_exporters
    from argus_exporters import collectives
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    argus_exporters.instrument(model, optimizer)
""")  # a one-rank gloo job, instrumented with the one-line API
ONE_RANK = ONE_RANK_START + textwrap.dedent("""
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed._functional_collectives as funcol
    group = dist.group.WORLD
    for step in range(4):
        if step == 2:  # from now on the world is the tp axis of a named mesh
            mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        x = torch.ones(4)
        out = model(x)
        dist.all_reduce(x)                                  # sync
        work = dist.all_gather_into_tensor(torch.empty(4), x, async_op=True)
        work.wait()                                         # async
        funcol.all_reduce(x, "sum", group).wait()           # DTensor's path
        out.sum().backward()
        optimizer.step()
    sub = dist.new_group([0])
    argus_exporters.register_group(sub, "pp")
    ops = torch.ops._c10d_functional
    out = model(x)
    dist.all_reduce(x, group=sub)
    funcol.all_reduce(x, "sum", sub).wait()                 # its name as the label
    # the group itself as the label (dist.config.compile_on_one_rank; 2.4 takes names only)
    takes_group = "Any group_name" in str(ops.all_reduce.default._schema)
    ops.wait_tensor(ops.all_reduce(x, "sum", sub if takes_group else sub.group_name))
    out.sum().backward()
    optimizer.step()
    state = collectives.installed()
    pending = state.pending() if state else 0
    hooks = type(vars(dist.ProcessGroup)["allreduce"]).__name__  # the wrappers installed
    import gc, weakref
    groups = [weakref.ref(sub)]  # (torch itself keeps the world's group)
    del group, sub, mesh, work
    dist.destroy_process_group()
    gc.collect()
    alive = sum(ref() is not None for ref in groups)
    argus_exporters.shutdown()
    print(json.dumps({"pending": pending, "groups_alive_after_destroy": alive,
                      "hooks": hooks}))
""")


def _run_script(tmp_path, source: str, env: dict) -> dict:
    """Run a one-rank job's ``source`` with Argus on (file sink in ``tmp_path/spool``) and
    ``env``; what its last line prints (JSON)."""
    script = tmp_path / "job.py"
    script.write_text(source)
    full = {**os.environ, "ARGUS_ENABLED": "1", "ARGUS_SINK": f"file://{tmp_path}/spool",
            "ARGUS_JOB": "one", **env}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=full,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_one_rank(tmp_path, env: dict) -> tuple[dict, dict]:
    result = _run_script(tmp_path, ONE_RANK, env)
    return result, load_traces([tmp_path / "spool"]).traces["one"]


def _names_by_step(trace) -> list[set[str]]:
    phases = trace.steps.phases
    return [{n for i, n in enumerate(trace.steps.phase_names) if phases[s, i] == phases[s, i]}
            for s in range(phases.shape[0])]


def _native_or_skip(native: str) -> None:
    """Skip the C wrappers' case where they cannot be built here (no compiler, no Python.h)."""
    from argus_exporters._native.extension import load_hooks

    if native == "1" and load_hooks() is None:
        pytest.skip("the collective hooks' extension cannot be built here (cc, python3-dev)")


HOOKS = {"1": "TimedMethod", "0": "function"}  # ARGUS_NATIVE_HOOKS -> the wrappers' type
FUNCTIONAL = {"1": "TimedOperator", "0": "function"}  # ... and the functional operators'


@pytest.mark.parametrize("native", ["1", "0"], ids=["c-wrappers", "python-wrappers"])
def test_every_collective_is_named_by_its_group_and_waited_for(tmp_path, native):
    """Sync, async and functional collectives each end at their wait (none left pending),
    named after their group: the default group is ``dp`` until a ``("tp",)`` mesh over the
    world names it ``tp``; a registered group is named by its axis, whether a functional
    operator is given its name or the group itself. Alike with the hooks' C wrappers and with
    their Python ones."""
    _native_or_skip(native)
    result, trace = _run_one_rank(tmp_path, {"ARGUS_NATIVE_HOOKS": native})
    assert result["hooks"] == HOOKS[native]
    steps = _names_by_step(trace)
    assert len(steps) == 5 and result["pending"] == 0
    assert steps[4] == {"forward", "pp-allreduce", "backward", "optimizer"}
    # nothing of Argus keeps a destroyed group alive (torn down at exit, gloo aborts)
    assert result["groups_alive_after_destroy"] == 0
    for names in steps[:2]:
        assert names == {"forward", "dp-allreduce", "dp-allgather", "backward", "optimizer"}
    for names in steps[2:4]:
        assert names == {"forward", "tp-allreduce", "tp-allgather", "backward", "optimizer"}


def test_argus_coords_win_over_what_meshes_say(tmp_path):
    """``ARGUS_COORDS`` set by the operator is never replaced by learned coordinates, and a
    default group that is not the dp axis is ``world``."""
    _, trace = _run_one_rank(tmp_path, {"ARGUS_COORDS": "pp=3"})
    assert trace.ranks[0].coords == (0, 0, 3, 0)
    steps = _names_by_step(trace)
    assert "world-allreduce" in steps[0] and "tp-allreduce" in steps[3]


MESH_FIRST = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/pg", rank=0,
                            world_size=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    import argus_exporters
    argus_exporters.instrument(model, optimizer)
    for step in range(2):
        x = torch.ones(4)
        model(x).sum().backward()
        dist.all_reduce(x)
        optimizer.step()
    dist.destroy_process_group()
""")  # the usual order: the mesh built, the model sharded, then the one line


def test_a_mesh_built_before_instrument_is_learned_quietly(tmp_path):
    """A DeviceMesh that existed before ``instrument`` names its group's collectives, and
    finding it warns about nothing (every warning shown: a user sees what the job prints)."""
    script = tmp_path / "mesh_first.py"
    script.write_text(MESH_FIRST)
    spool = tmp_path / "spool"
    env = {**os.environ, "ARGUS_ENABLED": "1", "ARGUS_SINK": f"file://{spool}",
           "ARGUS_JOB": "mesh"}
    proc = subprocess.run([sys.executable, "-W", "always", str(script), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    steps = _names_by_step(load_traces([spool]).traces["mesh"])
    assert all("tp-allreduce" in names for names in steps), steps


ZERO_CODE = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.ones(4)
        model(x).sum().backward()
        dist.all_reduce(x, group=mesh.get_group(0))
        optimizer.step()
    dist.destroy_process_group()
""")  # no line of Argus: ``argus run`` hooks in while torch imports


def test_argus_run_times_collectives_from_the_first_step_and_says_nothing(tmp_path):
    """``argus run`` installs the collective hooks from inside torch's own import (when its
    device mesh module loads, before ``torch.compiler`` exists): they install quietly and
    time the job's collectives from its first step."""
    script = tmp_path / "zero_code.py"
    script.write_text(ZERO_CODE)
    spool = tmp_path / "spool"
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "argus"), "run", "--sink", f"file://{spool}", "--job", "zero", "--",
         str(bin_dir / "torchrun"), "--nproc-per-node", "1", "--master-port",
         str(free_port()), str(script)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "argus: could not" not in proc.stderr, proc.stderr
    steps = _names_by_step(load_traces([spool]).traces["zero"])
    assert len(steps) == 3 and all("tp-allreduce" in names for names in steps), steps


def test_off_patches_nothing(tmp_path):
    """``ARGUS_COLLECTIVES=0``: no collective phase, DDP-less jobs keep only their phases."""
    _, trace = _run_one_rank(tmp_path, {"ARGUS_COLLECTIVES": "0"})
    assert {"forward", "backward", "optimizer"} == set(trace.steps.phase_names)


COMPILED_ONE_RANK = ONE_RANK_START + textwrap.dedent("""
    def exchange(x):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        dist.all_reduce(out)
        return out * 2

    compiled = torch.compile(exchange, backend=sys.argv[2])
    for step in range(4):
        out = model(torch.ones(4))
        compiled(out.detach())
        out.sum().backward()
        optimizer.step()
    state = collectives.installed()
    pending = state.pending()
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    argus_exporters.shutdown()
    dist.destroy_process_group()
    print(json.dumps({"pending": pending, "graph_breaks": breaks}))
""")


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_collectives_traced_into_a_compiled_graph_are_timed_when_it_runs(backend, tmp_path):
    """``dist.all_to_all_single`` and ``dist.all_reduce`` inside a compiled function become
    functional operators of the graph (called as the packet by dynamo's graph, as the
    overload by AOT autograd's and by inductor's generated code): each is timed when the
    graph runs, every step, and ends at its wait, with no graph break."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED_ONE_RANK)
    spool = tmp_path / "spool"
    env = {**os.environ, "ARGUS_ENABLED": "1", "ARGUS_SINK": f"file://{spool}",
           "ARGUS_JOB": "one"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), backend], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"pending": 0, "graph_breaks": 0}
    steps = _names_by_step(load_traces([spool]).traces["one"])
    assert len(steps) == 4
    for names in steps:
        assert {"dp-alltoall", "dp-allreduce"} <= names, names


UNWAITED = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/pg", rank=0,
                            world_size=1)
    import argus_exporters
    from argus_exporters import collectives
    model = torch.nn.Linear(4, 4)
    argus_exporters.instrument(model, torch.optim.SGD(model.parameters(), lr=0.1))
    works = [dist.all_reduce(torch.ones(1), async_op=True) for _ in range(10_000)]
    tracer = argus_exporters.get_tracer()
    print(json.dumps({"pending": collectives.installed().pending(),
                      "dropped": tracer.health.dropped.get("unwaited", 0)}))
""")


@pytest.mark.parametrize("native", ["1", "0"], ids=["c-wrappers", "python-wrappers"])
def test_collectives_nobody_waits_for_are_bounded_and_counted(tmp_path, native):
    """10,000 async collectives never waited for (fire-and-forget): at most MAX_PENDING are
    remembered, the others are dropped and counted, training goes on."""
    from argus_exporters.collectives import MAX_PENDING

    _native_or_skip(native)
    result = _run_script(tmp_path, UNWAITED, {"ARGUS_NATIVE_HOOKS": native})
    assert result["pending"] <= MAX_PENDING
    assert result["pending"] + result["dropped"] == 10_000


RECORDED = ONE_RANK_START + textwrap.dedent("""
    from argus_exporters._native.extension import load_hooks
    tracer = argus_exporters.get_tracer()
    group = dist.group.WORLD
    x = torch.ones(4)
    dist.all_reduce(x)
    tracer.step()  # step 0 measures its CPU time (off the common path); step 1 does not
    dist.all_reduce(x)                                      # sync, the step's first mark
    dist.all_reduce(x)                                      # sync
    work = dist.all_gather_into_tensor(torch.empty(4), x, async_op=True)
    work.wait()                                             # async, waited
    dist.broadcast(x, 0)
    dist.barrier()
    import torch.distributed._functional_collectives as funcol
    funcol.all_reduce(x, "sum", group).wait()               # DTensor's path
    ops = torch.ops._c10d_functional                        # a compiled graph's calls
    ops.wait_tensor(ops.all_gather_into_tensor(x, 1, group_name=group.group_name))
    ops.wait_tensor(ops.all_reduce(x, "sum", group.group_name)[1:])  # waited through a view
    first = ops.all_reduce(x, "sum", group.group_name)      # two in flight: the newest
    second = ops.all_gather_into_tensor(x, 1, group_name=group.group_name)  # moves it aside
    ops.wait_tensor(second[1:])                             # the newest, through a view
    ops.wait_tensor(first)                                  # the first, moved aside
    older = dist.all_reduce(x, async_op=True)               # two works in flight: the newest
    newer = dist.broadcast(x, 0, async_op=True)             # moves the older aside
    older.wait()
    newer.wait()
    unwaited = dist.all_reduce(x, async_op=True)            # issued, never waited
    try:
        group.allreduce("not a tensor")                     # the backend refuses the call
    except Exception as exc:
        refused = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    else:
        refused = None
    step = tracer._current
    cells = [c if c is None or isinstance(c, (int, str)) else repr(c) for c in step.cells]
    state = collectives.installed()
    print(json.dumps({"cells": cells, "marks": len(step.marks), "refused": refused,
                      "functional": type(vars(ops.all_reduce)["_op"]).__name__,
                      "tensors": len(state.tensors) + len(state.newest_result),
                      "index": step.index, "sampled": tracer._sampled,
                      "qualname": dist.ProcessGroup.allreduce.__qualname__,
                      "pending": len(state.works) + len(state.newest_work),
                      "hooks": type(vars(dist.ProcessGroup)["allreduce"]).__name__}))
    argus_exporters.shutdown()
    dist.destroy_process_group()
""")


def test_the_c_wrappers_record_what_the_python_ones_record(tmp_path):
    """The same collectives (sync, async then waited, broadcast, barrier, DTensor's functional
    all-reduce, a compiled graph's operator and wait_tensor, one never waited, one the backend
    refuses) leave the same intervals in the step with the hooks' C wrappers
    and recording as with their Python ones: each one's name, marks, kind, wait and stream,
    and the same pending work and the same error for the refused call, raised to the
    caller. A functional collective waited for through a view of its result ends there."""
    _native_or_skip("1")
    script = tmp_path / "recorded.py"
    script.write_text(RECORDED)
    got = {}
    for native in ("1", "0"):
        env = {**os.environ, "ARGUS_ENABLED": "1", "ARGUS_JOB": "one",
               "ARGUS_SINK": f"file://{tmp_path}/spool-{native}", "ARGUS_NATIVE_HOOKS": native}
        (tmp_path / native).mkdir()
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / native)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        got[native] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got[native].pop("hooks") == HOOKS[native]
        assert got[native].pop("functional") == FUNCTIONAL[native]
    assert got["1"] == got["0"]
    assert got["1"]["refused"] and got["1"]["pending"] == 1 and got["1"]["tensors"] == 0
    assert got["1"]["index"] == 1 and not got["1"]["sampled"]
    assert got["1"]["qualname"] == "argus_timed(allreduce)"  # what a traceback shows
    names = got["1"]["cells"][::8]  # STRIDE cells an interval, its name first
    assert names == ["dp-allreduce", "dp-allreduce", "dp-allgather", "dp-broadcast",
                     "dp-barrier", "dp-allreduce", "dp-allgather", "dp-allreduce",
                     "dp-allreduce", "dp-allgather", "dp-allreduce", "dp-broadcast",
                     "dp-allreduce", "dp-allreduce"]
    ended = got["1"]["cells"][2::8]  # each one's END mark: none for the unwaited and refused
    assert [mark >= 0 for mark in ended] == [True] * 12 + [False, False]
    # the two in flight at once end in the order they were waited for
    assert ended[9] < ended[8] and ended[10] < ended[11]


HELD = ONE_RANK_START + textwrap.dedent("""
    import weakref
    import torch.distributed._functional_collectives  # the hooks wrap the operators then
    ops = torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    x = torch.ones(4)
    alive = {}
    result = ops.all_reduce(x, "sum", name)
    ref = weakref.ref(result)
    ops.wait_tensor(result)                                 # waited as itself
    del result
    alive["waited"] = ref() is not None
    result = ops.all_reduce(x, "sum", name)
    ref = weakref.ref(result)
    ops.wait_tensor(result[1:])                             # waited through a view
    del result
    alive["waited_through_a_view"] = ref() is not None
    first = ops.all_reduce(x, "sum", name)
    second = ops.all_reduce(x, "sum", name)
    refs = [weakref.ref(first), weakref.ref(second)]
    ops.wait_tensor(first)                                  # the older one first
    ops.wait_tensor(second)
    del first, second
    alive["both_in_flight"] = any(ref() is not None for ref in refs)
    state = collectives.installed()
    pending = state.pending()
    unwaited = ops.all_reduce(x, "sum", name)               # never waited for
    pending_unwaited = state.pending()
    collectives.uninstall()
    print(json.dumps({"alive": alive, "pending": pending, "pending_unwaited": pending_unwaited,
                      "held_after_uninstall": len(state.newest_work) + len(state.newest_result)}))
    argus_exporters.shutdown()
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("native", ["1", "0"], ids=["c-wrappers", "python-wrappers"])
def test_a_waited_functional_result_is_not_kept_alive(tmp_path, native):
    """The C wrappers hold the newest functional result until its wait (found there as itself,
    without its storage's address): waited for as itself, through a view, or after a newer
    one was issued, it is let go at its wait; one never waited for is pending (torch keeps it
    for its wait too) until the hooks are uninstalled."""
    _native_or_skip(native)
    got = _run_script(tmp_path, HELD, {"ARGUS_NATIVE_HOOKS": native})
    assert got == {"alive": {"waited": False, "waited_through_a_view": False,
                             "both_in_flight": False},
                   "pending": 0, "pending_unwaited": 1, "held_after_uninstall": 0}


def _host_recording(tmp_path):
    """A tracer on the host clock and the hooks' C recording of it (skipped where the
    extension cannot be built), past its first, CPU-sampled step."""
    from argus_exporters._native.extension import load_hooks

    _native_or_skip("1")
    tracer = Tracer(Settings(enabled=True, sink=f"file://{tmp_path}", flush_s=0.05), IDENTITY,
                    clock=HostClock())
    begin, end = tracer.collective_recording(load_hooks())
    assert tracer.collective_recording(load_hooks()) == (begin, end)  # one recorder a tracer
    tracer.step()
    end(begin("dp-allreduce"), None)  # the step's first mark: the tracer's own method
    return tracer, begin, end


def test_the_c_recording_follows_the_tracer_step_to_step(tmp_path):
    """The C recorder's marks are the tracer's host clock (perf_counter_ns), its tokens name
    the step they were issued in, it flags the step as holding collectives, a step closed
    under it is recorded no more (its end counted late), and once the tracer is shut down it
    records nothing."""
    import time

    from argus_exporters.tracer import END, SLOT_BITS, START, STRIDE

    tracer, begin, end = _host_recording(tmp_path)
    step = tracer._current
    before = time.perf_counter_ns()
    token = begin("dp-allgather")
    after = time.perf_counter_ns()
    base = len(step.cells) - STRIDE
    assert token == (step.index << SLOT_BITS) | base and step.index == 1
    assert step.cells[base] == "dp-allgather" and step.collectives
    assert before <= step.marks[step.cells[base + START]] <= after
    end(token, None)
    assert step.cells[base + END] == len(step.marks) - 1
    late = begin("dp-allreduce")
    tracer.step()
    end(late, None)  # its step has closed
    assert tracer.health.dropped["late_phase"] == 1
    follower = tracer._current
    end(begin("dp-allreduce"), None)  # the new step's first mark: the tracer's method
    end(begin("dp-broadcast"), None)
    assert follower.cells[::STRIDE] == ["dp-allreduce", "dp-broadcast"]
    tracer.shutdown()
    assert begin("dp-allreduce") is None


def test_the_c_recording_waits_for_a_thread_holding_the_tracers_lock(tmp_path):
    """A collective begun while another thread is inside the tracer's lock (closing a step,
    reading its marks) waits until the lock is free: the C recorder never writes a step that
    another thread is in the middle of reading or replacing."""
    import threading

    from argus_exporters.tracer import STRIDE

    tracer, begin, end = _host_recording(tmp_path)
    step = tracer._current
    tokens: list = []
    issued = threading.Event()

    def issue() -> None:
        tokens.append(begin("dp-allgather"))
        issued.set()

    with tracer._lock:
        thread = threading.Thread(target=issue)
        thread.start()
        assert not issued.wait(0.3)  # blocked while the lock is held
        held = len(step.cells)
    thread.join(timeout=60)
    assert issued.is_set() and held == STRIDE  # nothing was written meanwhile
    end(tokens[0], None)
    assert step.cells[::STRIDE] == ["dp-allreduce", "dp-allgather"]
    tracer.shutdown()


def test_hooks_that_cannot_be_built_fall_back_to_python(tmp_path):
    """No compiler that works and nothing cached: the job trains with the Python wrappers,
    every collective still timed, and the log says why once."""
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK)
    spool = tmp_path / "spool"
    env = {**os.environ, "ARGUS_ENABLED": "1", "ARGUS_SINK": f"file://{spool}",
           "ARGUS_JOB": "one", "ARGUS_CACHE_DIR": str(tmp_path / "cache"), "CC": "false"}
    env.pop("ARGUS_HOOKS_LIB", None)
    proc = subprocess.run([sys.executable, "-c", "import logging, runpy, sys; "
                           "logging.basicConfig(level=logging.INFO); "
                           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
                           "run_name='__main__')", str(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["hooks"] == "function"
    said = [line for line in proc.stderr.splitlines() if "hooks run as Python" in line]
    assert len(said) == 1 and "building the collective hooks failed" in said[0], proc.stderr
    names = set().union(*_names_by_step(load_traces([spool]).traces["one"]))
    assert {"dp-allreduce", "dp-allgather", "tp-allreduce"} <= names


@pytest.mark.parametrize("case", PARALLEL_CASES, ids=lambda c: c.name)
def test_every_parallelism_gets_exactly_its_verdict(case, tmp_path):
    """A fresh real job: the faulty rank and its cause, nothing on the ranks that waited in
    its collectives, nothing on a healthy job.

    A healthy job whose only verdicts say a rank was short of CPU was slowed by this machine
    (the suite's other processes on its two cores took that rank's CPU, which Argus saw in
    its run delay): it is run again, at most twice, for a run the machine left alone."""
    for attempt in range(3):
        spool = tmp_path / f"spool-{attempt}"
        real_jobs.run_case(case, spool, steps=STEPS)
        outcome = real_jobs.judge(case, spool)
        starved_only = bool(outcome["verdicts"]) and sorted(
            outcome["verdicts"]) == outcome["short_of_cpu"]
        if case.expected or not starved_only:
            break
    assert outcome["verdicts"] == case.expected, outcome["evidence"]
    assert outcome["as_expected"], outcome  # a slow link's ends name each other
    trace = load_traces([spool]).traces[case.name]
    learned = {"tp": lambda r: (0, r, 0, 0), "moe": lambda r: (0, 0, 0, r),
               "pp": lambda r: (r // 2, 0, r % 2, 0), "pp4": lambda r: (0, 0, r, 0)}.get(
                   case.env["ARGUS_TEST_PARALLEL"], lambda r: (r, 0, 0, 0))
    assert {r: info.coords for r, info in trace.ranks.items()} == {
        r: learned(r) for r in range(case.ranks)}  # from the meshes' named dimensions
    axis = {"tp": "tp", "moe": "ep", "pp": "pp", "pp4": "pp"}.get(
        case.env["ARGUS_TEST_PARALLEL"], "dp")
    timed = {name for name in trace.steps.phase_names if name.startswith(f"{axis}-")}
    assert timed, f"no {axis} collective timed: {trace.steps.phase_names}"  # one-line or not
    if case.env["ARGUS_TEST_PARALLEL"].startswith("pp"):  # sends and recvs name their peers
        _assert_pipeline_peers(spool, case)


def _assert_pipeline_peers(spool: Path, case) -> None:
    """Each stage's sends and recvs name the neighbouring stages they exchanged with, one
    message per micro-batch each way, within the phase's time."""
    stages = 4 if case.env["ARGUS_TEST_PARALLEL"] == "pp4" else 2
    micro = 4 if stages == 4 else 2
    seen = 0
    for path in spool.rglob("*.ndjson*"):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as lines:
            for line in lines:
                record = json.loads(line)
                if record["kind"] != "step" or "peers" not in record:
                    continue
                stage = record["rank"] % stages  # ranks r and r + 1 are one dp replica's
                first = record["rank"] - stage  # the replica's stage 0
                neighbours = {first + s for s in (stage - 1, stage + 1) if 0 <= s < stages}
                for phase in ("pp-send", "pp-recv"):
                    by_peer = record["peers"][phase]
                    assert {int(p) for p in by_peer} == neighbours, record
                    for value in by_peer.values():
                        assert value["n"] == micro
                        assert value["min_s"] <= value["s"] <= record["phases"][phase] + 1e-6
                seen += 1
    assert seen >= case.ranks * (STEPS - 5)


def _graph_breaks(tmp_path, parallel: str, argus: bool, fault: dict,
                  compile_mode: str = "1") -> tuple[dict, Path]:
    counters = tmp_path / f"counters-{argus}"
    spool = tmp_path / f"spool-{argus}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ARGUS_TEST_PARALLEL": parallel,
           "ARGUS_TEST_STEPS": str(STEPS), "ARGUS_TEST_COMPILE": compile_mode,
           "ARGUS_TEST_COUNTERS": str(counters), **fault}
    if argus:
        env.update(ARGUS_ENABLED="1", ARGUS_TEST_INSTRUMENT="1", ARGUS_JOB="compiled",
                   ARGUS_SINK=f"file://{spool}")
    command = [str(real_jobs.BIN / "torchrun"), "--nproc-per-node", "2", "--master-port",
               str(free_port()), str(real_jobs.PARALLEL_SCRIPT)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(Path(f"{counters}.0.json").read_text()), spool


def _reasons(counters: dict) -> set[str]:
    """Dynamo's graph-break reasons, without the addresses of the objects they name."""
    return {re.sub(r" at 0x[0-9a-f]+", "", reason) for reason in counters["reasons"]}


COMPILED_COLLECTIVE = {"ddp": "dp-allreduce", "fsdp1": "dp-allgather", "fsdp2": "dp-allgather",
                       "tp": "tp-allreduce", "moe": "ep-alltoall"}  # a collective each
# compiled job has timed


@pytest.mark.parametrize(("parallel", "compile_mode"),
                         [("ddp", "1"), ("fsdp1", "1"), ("fsdp2", "1"), ("tp", "1"),
                          ("moe", "1"), ("ddp", "first")])
def test_a_compiled_model_is_diagnosed_without_graph_breaks_of_argus(parallel, compile_mode,
                                                                     tmp_path):
    """``torch.compile`` after ``instrument`` (or ``instrument`` of the compiled model, whose
    DDP module inside still gets its comm hook): the slow rank is found, its collectives are
    timed (the MoE layer's all-to-all and DTensor's all-reduces run inside the graph), and
    dynamo reports no graph-break reason that the same job without Argus does not have."""
    fault = {"ARGUS_TEST_SLOW_RANK": "1", "ARGUS_TEST_FAULT": "compute",
             "ARGUS_TEST_SLEEP_S": "0.02"}
    plain, _ = _graph_breaks(tmp_path, parallel, False, fault, compile_mode)
    traced, spool = _graph_breaks(tmp_path, parallel, True, fault, compile_mode)
    assert _reasons(traced) <= _reasons(plain)
    from argus_core.detect.diagnose import diagnose

    trace = load_traces([spool]).traces["compiled"]
    assert COMPILED_COLLECTIVE[parallel] in trace.steps.phase_names
    doc = diagnose(trace).to_json()
    assert {v["rank"]: v["cause"] for v in doc["verdict"]} == {1: "compute"}, json.dumps(
        {"verdict": doc["verdict"], "l1": doc.get("l1")}, indent=1)[:6000]
