"""GPU check (H200): Argus's overhead on the paper's two workloads, all probes on vs all off.

    python bench/gpu_overhead.py [--rounds 6] [--steps 30] [--deadline-s 200] [--out PATH]
                                 [--workloads launch_heavy,gemm_heavy,transformer]
                                 [--diagnose]
                                 [--json] [--dry-run]

Wheels (bench/gpu_all.sh installs them from ``.whl/``): ``orjson`` cp312 manylinux x86_64
(needed: the file sink encodes every record), ``cupti-python==13.0.1`` cp312 (the kernel probe;
without it the all-on mode runs without kernels and says so), ``py-spy`` manylinux x86_64 (the
stack probe; likewise optional). Runs from a plain checkout: ``argus_exporters`` is loaded from
``exporters/`` when it is not installed.

Launch-heavy: eager MLP of 48 x (Linear(512) + GELU), bf16, 8 x 256 tokens. GEMM-heavy:
8 x Linear(4096), bf16, 8,192 tokens. Transformer (real jobs sit between the two): a small
GPT-style model, eager, bf16: vocabulary 8,192, width 512, 8 heads, 6 pre-norm blocks
(layer norm, causal ``scaled_dot_product_attention``, GELU MLP), tied output projection and
cross-entropy, 8 x 256 tokens. Each step is forward, backward and an AdamW step. Per
workload and mode, ``--rounds`` rounds of four segments in ABBA order (off, on, on, off),
``--steps`` steps each, timed with a device synchronise at segment edges only:

- off: no hooks; the kernel probe paused and drained (CONCURRENT_KERNEL off, no flushes); no
  stack probe running. The tracer's own threads are idle (nothing pending).
- all_on: phase hooks on CUDA events, CUPTI kernels (the probe's duty: ``auto`` unless
  ``ARGUS_KERNEL_DUTY`` says otherwise), py-spy stack samples every second (30x the default
  period: a stack probe started before the segment and stopped after it, outside the timing),
  the metrics endpoint, the file sink. The worst case.
- defaults: the same with every setting at the default a user gets from
  ``argus_exporters.start()`` (stack samples every ``ARGUS_STACK_PERIOD_S``, 30 s): what the
  2% / 1% targets are about.
- phases_only: the phase hooks alone (the paper's ~1%).

With ``--diagnose``, modes that split the cost (``DIAGNOSE_MODES`` below) and the training
thread's extra CPU time per step (``time.thread_time``: work it did, as opposed to waiting).

A round's overhead is (on - off) / off over its two on and two off segments; the median over
rounds is reported with its spread. Targets: <= 2% launch-heavy, <= 1% GEMM-heavy and
transformer. Rounds stop
early when the next one would not fit in ``--deadline-s`` (each workload gets half); the rounds
done are reported. The JSON (last line) also goes to ``--out`` (default
``$OUT/gpu_overhead.json`` when ``OUT`` is set). No GPU: ``{"ok": false, "error": ...}``, exit 2.
``--dry-run`` runs the same orchestration on the CPU (tiny models, host clock, one round of two
steps), which CI does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
from _gpu_env import (
    Deadline,
    default_out,
    ensure_argus_exporters,
    finish,
    free_port,
    no_gpu_reason,
    versions,
    write_json,
)

ARGUS_FROM = ensure_argus_exporters()
MODES = ("all_on", "defaults", "phases_only")
# --diagnose adds modes that split the phases' cost (each against the same ABBA "off"):
#   hooks_noop      the same torch hooks calling a tracer that does nothing (torch's hook cost)
#   phases_inline   the real tracer with its resolver thread parked: marks and bookkeeping on
#                   the training thread only, no background Python competing for the GIL
#   kernels_only    CUPTI kernel activity on, no hooks (the driver's per-launch cost)
#   stacks_only     the py-spy stack probe alone (no hooks, no kernels)
DIAGNOSE_MODES = ("hooks_noop", "phases_inline", "kernels_only", "stacks_only")
TARGETS_PCT = {"launch_heavy": 2.0, "gemm_heavy": 1.0, "transformer": 1.0}


def gpt(torch, vocab: int, width: int, heads: int, layers: int):
    """A small GPT-style language model whose forward returns its next-token loss: token and
    position embeddings, pre-norm blocks of causal self-attention (``scaled_dot_product_
    attention``) and a GELU MLP, a final layer norm and a tied output projection."""
    nn, functional = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            batch, seq, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
            q, k, v = (t.view(batch, seq, heads, width // heads).transpose(1, 2)
                       for t in (q, k, v))
            attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
            return x + self.mlp(self.norm2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(1024, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(width)

        def forward(self, ids):
            seq = ids.shape[1]
            x = self.tokens(ids) + self.positions(torch.arange(seq, device=ids.device))
            for block in self.blocks:
                x = block(x)
            logits = self.norm(x) @ self.tokens.weight.t()
            return functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                            ids[:, 1:].reshape(-1))

    return GPT()


def build(torch, kind: str, device: str, tiny: bool):
    """(model, optimizer, input) of one workload."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if kind == "transformer":
        vocab, width, heads, layers, batch, seq = ((64, 32, 2, 1, 2, 8) if tiny else
                                                   (8192, 512, 8, 6, 8, 256))
        model = gpt(torch, vocab, width, heads, layers).to(device=device, dtype=dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        return model, optimizer, ids
    if kind == "launch_heavy":
        width, depth, tokens = (32, 4, 8) if tiny else (512, 48, 8 * 256)
        layers = [m for _ in range(depth) for m in (torch.nn.Linear(width, width),
                                                    torch.nn.GELU())]
    else:
        width, depth, tokens = (32, 2, 8) if tiny else (4096, 8, 8192)
        layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, optimizer, torch.randn(tokens, width, device=device, dtype=dtype)


LAST_CPU = [0.0]  # the training thread's CPU seconds in the last run_steps


def run_steps(torch, model, optimizer, x, steps: int, sync) -> float:
    """Seconds for ``steps`` training steps, synchronised at both ends only."""
    sync()
    cpu0 = time.thread_time()
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(x)  # the transformer returns its loss; the MLPs their activations
        (out if out.ndim == 0 else out.float().pow(2).mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    LAST_CPU[0] = time.thread_time() - cpu0
    return time.perf_counter() - t0


class _NoOpTracer:
    """Enabled, but every call does nothing: what torch's hooks alone cost."""

    enabled = True
    settings = SimpleNamespace(collectives=False)  # one GPU, no process group: nothing to time

    def begin_phase(self, name, stream=None, span=False):
        return None

    def end_phase(self, token, stream=None):
        return None

    def step(self):
        return None


class _Steps:
    """Per-step callback for the kernel probe (as argus_exporters.start wires it)."""

    def __init__(self, probe):
        self.probe = probe

    def on_step(self, step: int, wall_s: float) -> None:
        self.probe.step_end(step, wall_s)
        self.probe.step_begin(step + 1)

    def shutdown(self, timeout: float) -> None:
        pass


class Bench:
    """The tracer and probes of one process, and the segments that switch them on and off."""

    def __init__(self, torch, device: str, spool: str):
        from argus_exporters.clock import CudaClock, HostClock
        from argus_exporters.config import Settings
        from argus_exporters.identity import RankIdentity
        from argus_exporters.kernels import KernelProbe
        from argus_exporters.metrics import serve
        from argus_exporters.tracer import Tracer

        self.torch = torch
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.settings = Settings(enabled=True, sink=f"file://{spool}", kernels=True,
                                 stacks=True, stack_period_s=1.0,
                                 extra={"training_rank": True})
        self.defaults = Settings(enabled=True, sink=f"file://{spool}", kernels=True,
                                 stacks=True, extra={"training_rank": True})
        self.identity = RankIdentity("gpu-overhead", 0, 1, 0, "device",
                                     {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
        clock = CudaClock(torch) if device == "cuda" else HostClock()
        self.tracer = Tracer(self.settings, self.identity, clock=clock)
        self.kernels = KernelProbe(self.settings, self.identity, self.tracer.emit,
                                   self.tracer.health)
        self.kernels_on = self.kernels.start()
        self.server = serve(self.tracer.metrics, free_port(), "127.0.0.1", self.tracer.health)
        self.stack_states: list[str] = []

    def segment(self, mode: str, model, optimizer, x, steps: int) -> float:
        """Seconds for one segment in ``mode`` (off, a mode of MODES or DIAGNOSE_MODES)."""
        from argus_exporters import hooks
        from argus_exporters.stacks import StackProbe

        if mode == "off":
            return run_steps(self.torch, model, optimizer, x, steps, self.sync)
        if mode == "hooks_noop":
            handles = hooks.instrument(model, optimizer, _NoOpTracer())
            seconds = run_steps(self.torch, model, optimizer, x, steps, self.sync)
            for handle in handles:
                handle.remove()
            return seconds
        if mode == "stacks_only":
            stacks = StackProbe(self.settings, self.identity, self.tracer.emit,
                                self.tracer.health)
            started = stacks.start()
            seconds = run_steps(self.torch, model, optimizer, x, steps, self.sync)
            if started:
                stacks.shutdown()
            return seconds
        if mode == "kernels_only":
            if self.kernels_on:
                self.kernels.step_begin(0)
            seconds = run_steps(self.torch, model, optimizer, x, steps, self.sync)
            self.kernels.pause()
            self.kernels.drain()
            self.tracer.force_flush()
            # Every step's kernels were recorded here with no step ends: keep them out of the
            # auto duty's next estimate, which counts kernels per traced step (otherwise the
            # following modes run at 1 step in 256).
            cycle, stats = self.kernels._cycle, self.kernels.stats
            cycle._records_at = stats.records + stats.cupti_dropped
            return seconds
        handles = hooks.instrument(model, optimizer, self.tracer)
        parked = mode == "phases_inline"
        if parked:  # the resolver's polls do nothing until the segment ends
            self.tracer.poll = lambda block=False: 0
        stacks = None
        if mode in ("all_on", "defaults"):
            if self.kernels_on:
                self.tracer.probes = [_Steps(self.kernels)]
                self.kernels.step_begin(0)
            settings = self.settings if mode == "all_on" else self.defaults
            stacks = StackProbe(settings, self.identity, self.tracer.emit,
                                self.tracer.health)
            if stacks.start():
                self.tracer.probes.append(stacks)
            self.stack_states.append(self.tracer.health.probes.get("stacks", ("?", ""))[0])
        seconds = run_steps(self.torch, model, optimizer, x, steps, self.sync)
        for handle in handles:
            handle.remove()
        if parked:
            del self.tracer.poll
        self.tracer.probes = []
        if stacks is not None:
            stacks.shutdown()
        self.kernels.pause()
        self.kernels.drain()
        self.tracer.force_flush()  # resolve this segment's steps before the next one
        return seconds

    def close(self) -> dict:
        """Stop everything; the exporter's health."""
        self.tracer.shutdown()
        self.kernels.shutdown()
        if self.server is not None:
            self.server.shutdown()
        health = self.tracer.health
        stats = self.kernels.stats
        return {"exporter_cpu_s": health.cpu_seconds, "dropped": dict(health.dropped),
                "records_shipped": health.records_shipped,
                "probes": {k: list(v) for k, v in health.probes.items()},
                "stack_probe_states": sorted(set(self.stack_states)),
                "kernel_records": stats.records, "kernel_buffers": stats.buffers,
                "kernel_duty": self.kernels.duty,
                "kernel_clock_offset_ns": stats.clock_offset_ns}


def measure(bench: Bench, kind: str, args, device: str, budget: Deadline) -> dict:
    """ABBA rounds of every mode on one workload, within ``budget``."""
    torch = bench.torch
    model, optimizer, x = build(torch, kind, device, args.dry_run)
    run_steps(torch, model, optimizer, x, 3 if args.dry_run else 20, bench.sync)  # warm-up
    modes = MODES + (DIAGNOSE_MODES if args.diagnose else ())
    rows: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu_rows: dict[str, list[float]] = {mode: [] for mode in modes}
    base_step, round_s = [], 0.0
    for _ in range(args.rounds):
        if rows[modes[0]] and budget.remaining() < 1.2 * round_s:
            break
        t0 = time.monotonic()
        for mode in modes:
            times = {"off": 0.0, "on": 0.0}
            cpu = {"off": 0.0, "on": 0.0}
            for segment in ("off", "on", "on", "off"):
                times[segment] += bench.segment("off" if segment == "off" else mode, model,
                                                optimizer, x, args.steps)
                cpu[segment] += LAST_CPU[0]
            rows[mode].append((times["on"] - times["off"]) / times["off"] * 100)
            cpu_rows[mode].append((cpu["on"] - cpu["off"]) / (2 * args.steps) * 1e6)
            base_step.append(times["off"] / (2 * args.steps) * 1e3)
        round_s = time.monotonic() - t0
    del model, optimizer, x
    if device == "cuda":
        torch.cuda.empty_cache()
    result = {"step_ms_off": float(np.median(base_step)), "rounds": len(rows[MODES[0]]),
              **{f"{mode}_overhead_pct": _spread(v) for mode, v in rows.items()}}
    if args.diagnose:  # the training thread's extra CPU per step: work it did, not waiting
        result["training_thread_extra_cpu_us_per_step"] = {
            mode: _spread(v)["median"] for mode, v in cpu_rows.items()}
    target = TARGETS_PCT[kind]
    result["all_on_meets_target"] = result["all_on_overhead_pct"]["median"] <= target
    result["defaults_meets_target"] = result["defaults_overhead_pct"]["median"] <= target
    return result


def _spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "p25": float(np.percentile(values, 25)),
            "p75": float(np.percentile(values, 75)), "min": float(min(values)),
            "max": float(max(values))}


def main(argv: list[str] | None = None) -> int:
    """Measure the workloads; print (and write) one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="ABBA rounds per mode")
    parser.add_argument("--steps", type=int, default=30, help="steps per segment")
    parser.add_argument("--deadline-s", type=float, default=200.0)
    parser.add_argument("--out", default=default_out("gpu_overhead.json"))
    parser.add_argument("--json", action="store_true", help="(always JSON; kept for make)")
    parser.add_argument("--diagnose", action="store_true",
                        help="also the modes that split the cost (hooks_noop, phases_inline, "
                             "kernels_only) and the training thread's extra CPU per step")
    parser.add_argument("--workloads", default="launch_heavy,gemm_heavy,transformer",
                        help="comma-separated: launch_heavy, gemm_heavy, transformer")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, tiny models, 1 round of 2 steps: check the orchestration")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.rounds, args.steps = 1, 2
    deadline = Deadline(args.deadline_s)
    reason = None if args.dry_run else no_gpu_reason(need_cupti=False)
    if reason:
        return finish({"ok": False, "error": reason, "versions": versions()}, args.out, 2)
    try:
        import orjson  # noqa: F401
    except ImportError:
        return finish({"ok": False, "error": "orjson is not importable: carry its cp312 wheel "
                       "(the file sink encodes records with it)", "versions": versions()},
                      args.out, 2)
    import torch

    device = "cpu" if args.dry_run else "cuda"
    result: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "dry_run": args.dry_run, "versions": versions(),
                    "argus_exporters": ARGUS_FROM, "rounds_asked": args.rounds,
                    "steps_per_segment": args.steps}
    spool = tempfile.mkdtemp(prefix="argus-gpu-")
    bench = Bench(torch, device, spool)
    kinds = tuple(k for k in args.workloads.split(",") if k)
    unknown = set(kinds) - set(TARGETS_PCT)
    if unknown or not kinds:
        parser.error(f"--workloads: unknown {sorted(unknown)}; choose from {sorted(TARGETS_PCT)}")
    try:
        for i, kind in enumerate(kinds):
            share = deadline.remaining() / (len(kinds) - i)
            result[kind] = measure(bench, kind, args, device, Deadline(share))
            write_json({**result, "ok": False, "partial": True}, args.out)  # if killed later
    finally:
        result.update(bench.close())
    result["deadline_left_s"] = round(deadline.remaining(), 1)
    result["ok"] = all(result[k]["rounds"] > 0 for k in kinds)
    return finish(result, args.out, 0 if result["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
