"""Benchmark: the exporter's cost per training step on CPU, and flat memory over 10,000 steps.

    python bench/exporter_cpu.py [--steps 10000] [--json] [--probe-only] [--against [REV]]
    python bench/exporter_cpu.py --collectives-only [--collective-parts] [--against REV]

A stand-in training step (single-threaded numpy matmuls, ~2 ms) runs with four phases per
step (forward, backward, dp-allreduce, optimizer). Overhead: 20 interleaved pairs of 200-step
runs with Argus off (the NoOp tracer: the baseline) and on (host clock, file sink, shipper
thread); ``overhead_pct`` is the median of the pairs' differences, with its spread. Then one
continuous 10,000-step run with Argus on: ``self_us_per_step`` is the exporter's own CPU time
(training-thread hooks plus its shipper thread, from thread CPU clocks) per step and
``rss_growth_mb`` the resident memory growth from step 1,000 to the end. Last, the training
thread's cost of timing one collective (``argus_exporters.collectives``), on a real one-rank
gloo process group: ``--collective-pairs`` rounds of ``--collective-calls``-call segments with
the hooks uninstalled (the baseline), installed as a job gets them (their C wrappers and
recording where ``_native/hooks.c`` builds: ``collective_hooks``) and with their Python
wrappers (``collective_*_python_overhead_cpu_us``, and ``collective_*_native_vs_python``), in
an order that rotates each round, each way a job makes one:
``dist.all_reduce`` sync, and async then waited; DTensor's functional collective then
``wait_tensor`` (``functional``); and the functional operator then its wait as a compiled
graph calls them (``graph``); ``collective_*_overhead_cpu_us`` is the median of the pairs'
differences in the training thread's CPU time per call, with its 95% bootstrap interval (its
wall time is dominated by gloo's hand-off to its worker thread, tens of us that vary more
than the hooks cost). ``--collectives-only`` measures only that; with ``--collective-parts``
also the hooks' wrappers alone (``collective_*_wrappers_cpu_us``: the tracer records
nothing), the tracer's recording alone in a hot loop (``collective_recording_hot_cpu_us``)
and its begin, end and share of the step's close each timed in place beside real calls and
in a hot loop (``collective_{begin,end,close}_{beside_gloo,hot}_us``), and with
``--against REV`` the same with REV's exporters, alternating subprocesses.

The phase probe on a device clock, without a device (first, and alone with ``--probe-only``):
``CudaClock`` over ``StandInCuda``, a ``torch.cuda`` with the same call pattern (record /
query / elapsed_time per event, raw ``cuda_event`` handles) and per-call costs calibrated on
the H200 (``--mark-us``, ``--query-us``, ``--elapsed-us``: spins that hold the GIL, as torch's
methods do; the ctypes reader's calls release it for the driver's time). A step is forward,
backward with ``--buckets`` DDP-like gradient buckets (the ``dp-allreduce`` span phase) and
optimizer. ``train_thread_us_per_step``: the training thread's extra CPU a step against
NoOpTracer, median of ``--probe-pairs`` interleaved pairs of ``--probe-steps``-step
segments (``train_thread_us_per_mark``: per tracer call); ``resolver_gil_us_per_step``: the
resolver thread's CPU a step (its GIL hold: the stand-in's released calls cost it nothing
else); event records and reads a step. ``torch_reader``: the same through torch's methods
(the fallback without libcudart). ``--against REV`` (default: main before the bulk probe)
extracts REV's ``exporters/`` with ``git archive`` and runs the same measurement with it and
with this tree, alternating subprocesses, and reports both and this tree's ratio.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a deterministic, one-core stand-in step
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _report import report
from scipy import stats

from argus_exporters.clock import HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import NoOpTracer, Tracer

PHASES = ("forward", "backward", "dp-allreduce", "optimizer")
PREVIOUS_PROBE = "fe8fdb151398e23edf452a85d80885af5d09adf3"  # main before the bulk probe


def rss_mb() -> float:
    """Resident set size of this process in MiB (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def loop(tracer, steps: int, work: np.ndarray) -> tuple[float, float, float]:
    """Run the stand-in job; returns (seconds, rss at step 1,000, rss at the end)."""
    rss_warm = 0.0
    t0 = time.perf_counter()
    for i in range(steps):
        for name in PHASES:
            with tracer.phase(name):
                np.dot(work, work)
        tracer.step()
        if i == 1000:
            rss_warm = rss_mb()
    return time.perf_counter() - t0, rss_warm, rss_mb()


def make_tracer(spool: str) -> Tracer:
    """Argus on, as in a training image: file sink, host clock, metrics collector."""
    settings = Settings(enabled=True, sink=f"file://{spool}", flush_s=0.5)
    identity = RankIdentity("bench", 0, 1, 0, "localhost", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
    return Tracer(settings, identity, clock=HostClock())


COLLECTIVE_KINDS = ("sync", "async", "functional", "graph")


def recording_cost(calls: int = 20_000, repeats: int = 10) -> float:
    """The tracer's recording of one collective as the hooks call it (its begin, the wait's
    mark, its end: in C on the host clock where ``_native/hooks.c`` loads; and its share of
    closing the step) in a hot loop, no collective run, ``calls`` to a step: us of the
    training thread's CPU per collective, best of ``repeats``."""
    from argus_exporters._native.extension import load_hooks

    with tempfile.TemporaryDirectory() as spool:
        tracer = make_tracer(spool)
        begin, end = tracer.collective_recording(load_hooks())
        mark = tracer.mark_now
        best = float("inf")
        for _ in range(repeats):
            c0 = time.thread_time()
            for _ in range(calls):
                end(begin("dp-allreduce"), mark())
            tracer.step()
            best = min(best, (time.thread_time() - c0) / calls * 1e6)
            tracer.poll()
        tracer.shutdown()
    return best


def recording_in_place(calls: int = 20_000) -> dict:
    """The tracer's ``begin_collective`` and ``end_collective`` each timed where the hooks
    call them, around real sync ``dist.all_reduce`` calls of a one-rank gloo group (the end
    right after the wait returns from gloo's worker thread), and the close of each step of 20
    of them (a twentieth per collective: it files their ends), against the same calls in a
    hot loop: medians in us, the timing's own cost (two clock reads) taken out. Where the
    hooks' cost beside gloo exceeds the hot loop's, this says which part pays it."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {}
    from argus_exporters import collectives
    from argus_exporters._native.extension import load_hooks

    clock = time.perf_counter_ns
    with tempfile.TemporaryDirectory() as spool:
        dist.init_process_group("gloo", init_method=f"file://{spool}/pg", rank=0,
                                world_size=1)
        tracer = make_tracer(spool)
        recording = tracer.collective_recording  # the recording the hooks call
        begin, end = recording(load_hooks() if tracer.settings.native_hooks else None)
        taken: dict[str, list[int]] = {"begin": [], "end": [], "clock": [], "close": []}

        def timed_begin(name, peer=-1):
            t0 = clock()
            token = begin(name, peer)
            taken["begin"].append(clock() - t0)
            return token

        def timed_end(token, waited_from=None):
            t0 = clock()
            end(token, waited_from)
            taken["end"].append(clock() - t0)

        tracer.collective_recording = lambda native=None: (timed_begin, timed_end)
        collectives.install(tracer)
        tensor = torch.ones(4)
        out = {}
        for where in ("beside_gloo", "hot"):
            for values in taken.values():
                values.clear()
            for i in range(calls):
                t0 = clock()
                taken["clock"].append(clock() - t0)
                if where == "beside_gloo":
                    dist.all_reduce(tensor)
                else:
                    timed_end(timed_begin("dp-allreduce"), clock())
                if i % 20 == 19:
                    t0 = clock()
                    tracer.step()
                    taken["close"].append(clock() - t0)
            own = float(np.median(taken["clock"]))
            for part in ("begin", "end"):
                out[f"collective_{part}_{where}_us"] = (
                    float(np.median(taken[part][calls // 10:])) - own) / 1e3
            # closing a step of 20 collectives (filing their ends), a twentieth a collective
            out[f"collective_close_{where}_us"] = (
                float(np.median(taken["close"][calls // 200:])) - own) / 20e3
        collectives.uninstall()
        tracer.shutdown()
        dist.destroy_process_group()
    return out


def collective_cost(pairs: int, calls: int = 200, recorded: bool = True) -> dict:
    """Per-call cost of the collective hooks against the same calls unhooked, same run:
    ``pairs`` rounds of ``calls``-call segments, unhooked, with the hooks as installed (their
    wrappers in C where ``_native/hooks.c`` builds, ``collective_hooks``) and with the Python
    wrappers (``ARGUS_NATIVE_HOOKS=0``), in an order that rotates each round (drift cancels);
    the median of the rounds' differences against the unhooked segment and its 95% bootstrap
    interval (``collective_{kind}_overhead_cpu_us``; ``..._python_overhead_cpu_us``). Without
    ``recorded``, the tracer records nothing (the hooks' begin returns None): the cost
    of the hooks' wrappers alone."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {}
    from argus_exporters import collectives
    from argus_exporters._native.extension import load_hooks

    with tempfile.TemporaryDirectory() as spool:
        dist.init_process_group("gloo", init_method=f"file://{spool}/pg", rank=0,
                                world_size=1)
        import torch.distributed._functional_collectives as funcol

        tracer = make_tracer(spool)
        if not recorded:  # the hooks' begin returns None: nothing recorded, nothing ended
            tracer.collective_recording = lambda native=None: (
                lambda name, peer=-1, stream=None: None, tracer.end_collective)
        tensor = torch.ones(4)
        world = dist.group.WORLD
        ops = torch.ops._c10d_functional
        calls_by_kind = {
            "sync": lambda: dist.all_reduce(tensor),
            "async": lambda: dist.all_reduce(tensor, async_op=True).wait(),
            "functional": lambda: funcol.all_reduce(tensor, "sum", world).wait(),
            "graph": lambda: ops.wait_tensor(ops.all_reduce(tensor, "sum", world.group_name)),
        }
        hooks = "native" if load_hooks() is not None else "python"
        arms = ("off", hooks) if hooks == "python" else ("off", "native", "python")
        settings = {"native": dataclasses.replace(tracer.settings, native_hooks=True),
                    "python": dataclasses.replace(tracer.settings, native_hooks=False)}

        def use(arm: str) -> None:
            collectives.uninstall()
            if arm != "off":
                tracer.settings = settings[arm]
                collectives.install(tracer)

        def run(call, arm: str) -> tuple[float, float]:
            """Per call: the training thread's CPU time and wall time, in us."""
            use(arm)
            t0, c0 = time.perf_counter(), time.thread_time()
            for i in range(calls):
                call()
                if i % 20 == 19:
                    tracer.step()
            return ((time.thread_time() - c0) / calls * 1e6,
                    (time.perf_counter() - t0) / calls * 1e6)

        out: dict[str, Any] = {"collective_pairs": pairs, "collective_calls": calls,
                               "collective_hooks": hooks}
        use(hooks)  # the functional hooks go in once funcol is imported
        for kind, call in calls_by_kind.items():
            for arm in arms:
                run(call, arm)  # warm
            got: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
            for pair in range(pairs):
                shift = pair % len(arms)
                for arm in arms[shift:] + arms[:shift]:
                    got[arm].append(run(call, arm))
            bases = got["off"]
            for arm, prefix in ((hooks, ""), ("python", "python_")):
                if arm not in got or (prefix and hooks == "python"):
                    continue
                cpu = np.array([on[0] - off[0] for on, off in zip(got[arm], bases, strict=True)])
                wall = [on[1] - off[1] for on, off in zip(got[arm], bases, strict=True)]
                interval = stats.bootstrap((cpu,), np.median, confidence_level=0.95,
                                           n_resamples=2000, method="percentile",
                                           random_state=0).confidence_interval
                key = f"collective_{kind}_{prefix}overhead"
                out[f"{key}_cpu_us"] = float(np.median(cpu))
                out[f"{key}_cpu_us_ci95"] = [float(interval.low), float(interval.high)]
                out[f"{key}_cpu_us_iqr"] = [float(np.percentile(cpu, 25)),
                                            float(np.percentile(cpu, 75))]
                out[f"{key}_wall_us"] = float(np.median(wall))
            out[f"collective_{kind}_baseline_cpu_us"] = float(np.median([b[0] for b in bases]))
            out[f"collective_{kind}_baseline_wall_us"] = float(np.median([b[1] for b in bases]))
            if hooks == "native":
                out[f"collective_{kind}_native_vs_python"] = (
                    out[f"collective_{kind}_overhead_cpu_us"]
                    / out[f"collective_{kind}_python_overhead_cpu_us"])
        collectives.uninstall()
        tracer.shutdown()
        dist.destroy_process_group()
    return out


# -- the phase probe's cost on a device clock, with CUDA stood in ----------------------------
BUCKETS = 4  # DDP-like gradient buckets inside backward: one span phase, dp-allreduce
# Per-call costs of the stand-in CUDA, calibrated on the H200 (docs/BENCHMARKS.md, "GPU"):
# torch's Event.query / elapsed_time ~3.8 us each, the GIL held; one Event.record ~1 us on the
# training thread ((104 - 89) us / 8 marks for the old probe's phases with its resolver parked,
# less ~0.9 us of its Python bookkeeping a mark).
MARK_US, QUERY_US, ELAPSED_US = 1.0, 3.8, 3.8
STANDIN_SOURCE = Path(__file__).resolve().parent / "standin_cudart.c"


def _spin(us: float) -> None:
    """Busy-wait ``us`` microseconds holding the GIL (a call into torch's C++ that holds it)."""
    if us > 0:
        end = time.perf_counter_ns() + int(us * 1e3)
        while time.perf_counter_ns() < end:
            pass


STAMPS = 1 << 16  # events a stand-in CUDA can make (their timestamps, shared with C)


class StandInCuda:
    """A ``torch`` whose ``cuda`` has CudaClock's call pattern and calibrated costs: events
    record (``mark_us``), query (``query_us``) and elapse (``elapsed_us``) by spinning with the
    GIL held, as torch's methods do; the device runs each event when it is recorded. Each
    event has a raw handle (``cuda_event``, an index into ``stamps``, its record time in ns)
    that ``stand_in_cudart`` reads."""

    def __init__(self, mark_us: float, query_us: float, elapsed_us: float):
        outer = self
        self.handles: dict[int, Any] = {}
        self.stamps = (ctypes.c_longlong * STAMPS)()
        self.records = 0  # Event.record calls (training thread)
        self.python_reads = 0  # query / elapsed_time calls through torch or a Python runtime
        self.c_reads: Any = None  # the C runtime's call counter, once one is made
        stamps = self.stamps

        class Stream:
            cuda_stream = 7

            def __init__(self, device: int = 0):
                self.device = device

        default = Stream()

        class Event:
            def __init__(self, enable_timing: bool = True):
                self.t = 0
                self.cuda_event = len(outer.handles) + 1
                if self.cuda_event >= STAMPS:
                    raise RuntimeError("the stand-in CUDA ran out of events")
                outer.handles[self.cuda_event] = self

            def record(self, stream=None) -> None:
                outer.records += 1
                _spin(mark_us)
                self.t = stamps[self.cuda_event] = time.perf_counter_ns()

            def query(self) -> bool:
                outer.python_reads += 1
                _spin(query_us)
                return True

            def elapsed_time(self, end) -> float:
                outer.python_reads += 1
                _spin(elapsed_us)
                return (end.t - self.t) * 1e-6

            def synchronize(self) -> None:
                pass

        self.cuda = types.SimpleNamespace(Event=Event, Stream=Stream,
                                          current_stream=lambda: default,
                                          current_device=lambda: 0)

    @property
    def reads(self) -> int:
        """Event reads so far, through torch's methods or the runtime."""
        return self.python_reads + (self.c_reads.value if self.c_reads is not None else 0)


def stand_in_cudart(cuda: StandInCuda) -> Any:
    """A CUDA runtime for ``CudartEvents`` over ``cuda``'s events: ``standin_cudart.c`` built
    with the exporters' native builder (C functions, so the bulk event reader can call them;
    each ctypes call releases the GIL as a call into libcudart does), or, without a compiler,
    Python functions that each make one real ctypes call releasing the GIL (libc ``labs``)."""
    try:  # the module (the package's own ``build`` is its function)
        native = importlib.import_module("argus_exporters._native.build")
    except ImportError:  # exporters from before the native builder
        native = None
    try:
        if native is None:
            raise OSError("this tree's exporters have no native builder")
        with tempfile.TemporaryDirectory() as out:
            path = native.build(Path(out), os.environ, STANDIN_SOURCE)
            library = ctypes.CDLL(str(path))
    except (OSError, RuntimeError) as exc:  # no compiler here (ShimUnavailableError)
        print(f"stand-in runtime in Python ({exc})", file=sys.stderr)
    else:
        library.argus_standin_bind(cuda.stamps)
        cuda.c_reads = ctypes.c_long.in_dll(library, "argus_standin_reads")
        return library
    labs = ctypes.CDLL(None).labs
    labs.argtypes, labs.restype = [ctypes.c_long], ctypes.c_long
    handles = cuda.handles

    def cudaEventQuery(handle: int) -> int:  # noqa: N802  (the runtime's names)
        cuda.python_reads += 1
        labs(handle)
        return 0

    def cudaEventElapsedTime(ms: Any, start: int, end: int) -> int:  # noqa: N802
        cuda.python_reads += 1
        labs(start)
        ms._obj.value = (handles[end].t - handles[start].t) * 1e-6
        return 0

    return types.SimpleNamespace(cudaEventQuery=cudaEventQuery,
                                 cudaEventElapsedTime=cudaEventElapsedTime)


def probe_step(tracer, work: np.ndarray, buckets: int) -> None:
    """One stand-in step: forward, backward with ``buckets`` DDP-like gradient buckets
    (``dp-allreduce``, a span phase as ``hooks.ddp_comm_hook`` times it), optimizer."""
    token = tracer.begin_phase("forward")
    np.dot(work, work)
    tracer.end_phase(token)
    backward = tracer.begin_phase("backward")
    for _ in range(buckets):
        np.dot(work, work)
        bucket = tracer.begin_phase("dp-allreduce", span=True)
        tracer.end_phase(bucket)
    tracer.end_phase(backward)
    token = tracer.begin_phase("optimizer")
    np.dot(work, work)
    tracer.end_phase(token)
    tracer.step()


def _thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds ``thread`` has used (Linux thread CPU clock)."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def probe_cost(pairs: int, steps: int, buckets: int = BUCKETS, mark_us: float = MARK_US,
               query_us: float = QUERY_US, elapsed_us: float = ELAPSED_US,
               reader: str = "cudart") -> dict:
    """The training thread's extra CPU a step (against NoOpTracer, interleaved pairs of
    ``steps``-step segments, median) and the resolver thread's CPU a step (its GIL hold: what
    it does without the GIL costs no CPU here), on a CudaClock over ``StandInCuda``.
    ``reader``: ``cudart`` (ctypes, GIL released) or ``torch`` (events' methods); a probe
    whose CudaClock predates readers always reads through the events' methods."""
    from argus_exporters.clock import CudaClock

    cuda = StandInCuda(mark_us, query_us, elapsed_us)
    kwargs: dict[str, Any] = {}
    parameters = inspect.signature(CudaClock).parameters
    if "events" in parameters:
        from argus_exporters.clock import CudartEvents, TorchEvents

        kwargs["events"] = (CudartEvents(stand_in_cudart(cuda)) if reader == "cudart"
                            else TorchEvents())
    else:
        reader = "torch (this probe's only way)"
    clock = CudaClock(cuda, pool_size=4 * (8 + 2 * buckets), **kwargs)
    work = np.random.default_rng(0).random((48, 48))
    noop = NoOpTracer()
    with tempfile.TemporaryDirectory() as spool:
        settings = Settings(enabled=True, sink=f"file://{spool}", flush_s=0.5)
        identity = RankIdentity("bench", 0, 1, 0, "localhost",
                                {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
        tracer = Tracer(settings, identity, clock=clock)
        resolver = tracer._resolver

        def segment(which) -> float:
            c0 = time.thread_time()
            for _ in range(steps):
                probe_step(which, work, buckets)
            return time.thread_time() - c0

        def drain() -> None:  # let the resolver thread resolve everything pending
            deadline = time.monotonic() + 30
            while tracer._pending and time.monotonic() < deadline:
                tracer._wake.set()
                time.sleep(0.005)

        segment(tracer)  # warm: the pool, the resolver, the sink
        segment(noop)
        drain()
        extra, gil = [], []
        records0, reads0 = cuda.records, cuda.reads
        for _ in range(pairs):
            base = segment(noop)
            r0 = _thread_cpu(resolver)
            on = segment(tracer)
            drain()
            gil.append((_thread_cpu(resolver) - r0) / steps * 1e6)
            extra.append((on - base) / steps * 1e6)
        records, reads = cuda.records - records0, cuda.reads - reads0
        bulk = getattr(clock.reader, "_bulk", None) is not None
        shipped = tracer.health.records_shipped
        tracer.shutdown()
    calls = 2 * 3 + 2 * buckets + 1  # begin/end of forward, backward, optimizer, buckets; step
    train = float(np.median(extra))
    return {"train_thread_us_per_step": train,
            "train_thread_us_per_step_iqr": [float(np.percentile(extra, 25)),
                                             float(np.percentile(extra, 75))],
            "train_thread_us_per_mark": train / calls,
            "resolver_gil_us_per_step": float(np.median(gil)),
            "resolver_gil_us_per_step_iqr": [float(np.percentile(gil, 25)),
                                             float(np.percentile(gil, 75))],
            "probe_event_records_per_step": records / (steps * pairs),
            "probe_event_reads_per_step": reads / (steps * pairs),
            "probe_reader": reader, "probe_bulk_reader": bulk, "probe_steps": steps,
            "probe_pairs": pairs,
            "probe_buckets": buckets, "probe_calls_per_step": calls,
            "probe_costs_us": {"mark": mark_us, "query": query_us, "elapsed": elapsed_us},
            "probe_records": shipped}


def against(rev: str, args: argparse.Namespace) -> dict:
    """The same probe measurement with the exporters of ``rev`` (``git archive`` into a temp
    dir, imported through PYTHONPATH) and with this tree's, alternating in subprocesses;
    medians of the rounds and this tree's ratio to ``rev``'s."""
    bench = Path(__file__).resolve().parent
    repo = bench.parent
    if args.collectives_only:
        options = ["--collectives-only", "--json", "--collective-pairs",
                   str(args.collective_pairs), "--collective-calls", str(args.collective_calls)]
        fields = tuple(f"collective_{kind}_{what}" for kind in COLLECTIVE_KINDS
                       for what in ("overhead_cpu_us", "baseline_cpu_us"))
    else:
        options = ["--probe-only", "--json", "--probe-steps", str(args.probe_steps),
                   "--probe-pairs", str(args.probe_pairs), "--buckets", str(args.buckets),
                   "--mark-us", str(args.mark_us), "--query-us", str(args.query_us),
                   "--elapsed-us", str(args.elapsed_us)]
        fields = ("train_thread_us_per_step", "resolver_gil_us_per_step",
                  "probe_event_records_per_step", "probe_event_reads_per_step")
    with tempfile.TemporaryDirectory() as tmp:
        commit = subprocess.run(["git", "rev-parse", rev], cwd=repo, check=True, text=True,
                                capture_output=True).stdout.strip()
        archive = subprocess.run(["git", "archive", commit, "exporters"], cwd=repo,
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        os.symlink(Path(tmp) / "exporters", Path(tmp) / "argus_exporters")
        runs: dict[str, list[dict]] = {"current": [], "previous": []}
        for _ in range(args.against_rounds):
            for which in ("previous", "current"):
                env = dict(os.environ)
                if which == "previous":
                    env["PYTHONPATH"] = os.pathsep.join(
                        [tmp, *filter(None, [env.get("PYTHONPATH")])])
                done = subprocess.run([sys.executable, str(bench / "exporter_cpu.py"),
                                       *options], env=env, capture_output=True, text=True,
                                      check=True, timeout=600)
                runs[which].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"against_rev": rev, "against_commit": commit,
                           "against_rounds": args.against_rounds}
    for field in fields:
        current = float(np.median([r[field] for r in runs["current"]]))
        previous = float(np.median([r[field] for r in runs["previous"]]))
        out[f"current_{field}"] = current
        out[f"previous_{field}"] = previous
        out[f"ratio_{field}"] = current / previous if previous > 0 else None
    if not args.collectives_only:
        out["previous_probe_reader"] = runs["previous"][0]["probe_reader"]
    return out


def main() -> None:
    """Measure; print one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--probe-steps", type=int, default=400,
                        help="steps per segment of the probe-cost pairs")
    parser.add_argument("--probe-pairs", type=int, default=15)
    parser.add_argument("--buckets", type=int, default=BUCKETS,
                        help="DDP-like buckets a step in the probe-cost step")
    parser.add_argument("--mark-us", type=float, default=MARK_US,
                        help="stand-in cost of one Event.record on the training thread")
    parser.add_argument("--query-us", type=float, default=QUERY_US,
                        help="stand-in cost of torch's Event.query (GIL held)")
    parser.add_argument("--elapsed-us", type=float, default=ELAPSED_US,
                        help="stand-in cost of torch's Event.elapsed_time (GIL held)")
    parser.add_argument("--probe-only", action="store_true",
                        help="only the probe cost (what --against runs for each tree)")
    parser.add_argument("--against", metavar="REV", nargs="?", const=PREVIOUS_PROBE,
                        default=None,
                        help=f"also measure the probe of git revision REV (default "
                             f"{PREVIOUS_PROBE[:12]}, main before the bulk probe) against "
                             f"this tree's, alternating subprocesses")
    parser.add_argument("--against-rounds", type=int, default=3)
    parser.add_argument("--collectives-only", action="store_true",
                        help="only the cost per collective (with --against: against REV's)")
    parser.add_argument("--collective-parts", action="store_true",
                        help="with --collectives-only: also the wrappers' cost alone")
    parser.add_argument("--collective-pairs", type=int, default=100)
    parser.add_argument("--collective-calls", type=int, default=200)
    args = parser.parse_args()
    if args.collectives_only:
        result = collective_cost(args.collective_pairs, args.collective_calls)
        if args.collective_parts:
            wrappers = collective_cost(args.collective_pairs, args.collective_calls, False)
            result.update({key.replace("_overhead_", "_wrappers_"): value
                           for key, value in wrappers.items() if "_overhead_" in key})
            result["collective_recording_hot_cpu_us"] = recording_cost()
            result.update(recording_in_place())
        if args.against:
            result["against"] = against(args.against, args)
        report(result, args.json)
        return
    probe = probe_cost(args.probe_pairs, args.probe_steps, args.buckets, args.mark_us,
                       args.query_us, args.elapsed_us)
    if args.probe_only:
        if args.against:
            probe["against"] = against(args.against, args)
        report(probe, args.json)
        return
    probe["torch_reader"] = {k: v for k, v in probe_cost(
        max(args.probe_pairs // 3, 2), args.probe_steps, args.buckets, args.mark_us,
        args.query_us, args.elapsed_us, reader="torch").items()
        if k.startswith(("train_thread_us_per_step", "resolver_gil_us_per_step"))}
    if args.against:
        probe["against"] = against(args.against, args)
    work = np.random.default_rng(0).random((200, 200))
    loop(NoOpTracer(), 300, work)  # warm caches
    with tempfile.TemporaryDirectory() as spool:
        tracer = make_tracer(spool)
        diffs, bases = [], []
        for _ in range(args.pairs):
            base_s, _, _ = loop(NoOpTracer(), 200, work)
            on_s, _, _ = loop(tracer, 200, work)
            diffs.append((on_s - base_s) / base_s * 100)
            bases.append(base_s / 200 * 1e3)
        tracer.shutdown()
    with tempfile.TemporaryDirectory() as spool:
        tracer = make_tracer(spool)
        on_s, rss_warm, rss_end = loop(tracer, args.steps, work)
        tracer.shutdown()
        list(tracer.metrics.collect())  # one scrape's worth of work
    health = tracer.health
    result = {"steps": args.steps, "baseline_step_ms": float(np.median(bases)),
              "overhead_pct": float(np.median(diffs)),
              "overhead_pct_iqr": [float(np.percentile(diffs, 25)),
                                   float(np.percentile(diffs, 75))],
              "self_us_per_step": health.cpu_seconds / args.steps * 1e6,
              "self_pct_of_step": health.cpu_seconds / on_s * 100,
              "rss_warm_mb": rss_warm, "rss_end_mb": rss_end,
              "rss_growth_mb": rss_end - rss_warm, "records_shipped": health.records_shipped,
              "dropped": dict(health.dropped), **probe,
              **collective_cost(args.collective_pairs, args.collective_calls)}
    report(result, args.json)


if __name__ == "__main__":
    main()
