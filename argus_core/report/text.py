"""The human-readable ``argus diagnose`` report: L1 to L3, verdicts, and what to open next."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from argus_core.detect.diagnose import Diagnosis, step_range
from argus_core.report.coverage import NotJudged, not_judged

NEXT_STEPS = {
    "compute": ("open rank {rank}'s kernel timeline around the slow kernels (Perfetto); check "
                "the GPU's clocks, temperature and ECC errors "
                "(`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,ECC`) and replace the node if they "
                "are off"),
    "communication": ("run nccl-tests across ranks {group} and check NIC, PCIe and NVLink "
                      "counters on their hosts (`ibstat`, `nvidia-smi nvlink -e`)"),
    "host": ("read the rank's py-spy stacks at the spike steps (kind=stack records); look for "
             "JIT compilation, garbage collection, data loading or checkpoint I/O"),
}


def render(diagnosis: Diagnosis, console: Console, rejected: int = 0) -> None:
    """Print the report for one job."""
    d = diagnosis
    m = d.matrix
    blind = {n.level: n for n in not_judged(d)}
    console.print(f"[bold]Argus diagnosis[/bold] of job [cyan]{d.job}[/cyan]: "
                  f"{len(m.ranks)} ranks, steps {step_range(m)}, {d.kernel_count:,} kernels"
                  + (f", {rejected:,} records rejected" if rejected else ""))
    for warning in d.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")

    console.rule("L1  iteration time (slowest rank per step)")
    if len(m.steps):
        median = float(np.nanmedian(d.l1.iteration_s)) if np.isfinite(d.l1.iteration_s).any() \
            else float("nan")
        console.print(f"median step {median:.3f} s over {int(d.l1.judged.sum())} judged steps")
    if "l1" in blind:
        console.print(f"[yellow]not judged[/yellow]: {blind['l1'].reason}")
    elif not d.l1.spikes and not d.l1.regressions:
        console.print("[green]no spikes, no regressions[/green]")
    for step, ratio in d.l1.regressions:
        console.print(f"[red]regression[/red] from step {step}: {ratio:.2f}x slower")
    for step, ratio in d.l1.spikes:
        console.print(f"[yellow]spike[/yellow] at step {step}: {ratio:.1f}x the local median")
    if d.l1.blips:
        console.print(f"[dim]{len(d.l1.blips)} step(s) above the spike ratio but within this "
                      f"job's own noise (a spike needs {d.l1.spike_threshold:.2f}x here): "
                      f"blips, not spikes[/dim]")

    console.rule("L2  straggler rank and phase (vs. parallel-group peers)")
    if d.l2.findings:
        table = Table("rank", "phase", "axis", "ratio", "robust z", "kind", "cost a step",
                      box=None)
        for f in d.l2.findings:
            cost = d.l2_cost(f.excess_s, f.onset)
            shown = f"{cost.seconds * 1e3:.1f} ms" + (f" ({cost.share:.1%})"
                                                      if cost.share is not None else "")
            table.add_row(str(f.rank), f.phase, f.axis, f"{f.ratio:.2f}x", f"{f.z:.1f}", f.kind,
                          shown)
        console.print(table)
    elif "l2" in blind:
        console.print(f"[yellow]not judged[/yellow]: {blind['l2'].reason}")
    else:
        console.print("[green]no phase stragglers[/green]")
    for f in d.host:
        console.print(f"rank {f.rank}: host time {f.excess_s * 1e3:.1f} ms a step above the "
                      f"other ranks' ({f.share:.1%} of the step, robust z {f.z:.1f})")
    small = 0
    for f in d.links:  # point-to-point links whose own time rose
        cost = d.l2_cost(f.cost_s, f.onset)
        if cost.share is not None and cost.share < d.cost_floor:
            small += 1
            continue
        console.print(f"link {f.sender} -> {f.receiver}{f' ({f.axis})' if f.axis else ''}: "
                      f"{f.after_s * 1e3:.2f} ms a step from step {f.onset} on, {f.ratio:.1f}x "
                      f"its {f.before_s * 1e3:.2f} ms before (z {f.z:.0f}), "
                      f"{cost.seconds * 1e3:.1f} ms a step"
                      + (f" ({cost.share:.1%})" if cost.share is not None else ""))
    if small:
        console.print(f"[dim]{small} link(s) slowed by less than the verdict floor[/dim]")
    waiters = sorted({r.rank for r in d.l2.roles if r.role == "waiter"})
    if waiters and (d.l2.findings or d.l3):
        console.print(f"[dim]{len(waiters)} rank(s) spend most of a collective waiting for a "
                      f"late peer; they are victims, not stragglers[/dim]")

    console.rule("L3  degraded kernels (directional W1 vs. healthy peers)")
    if d.l3:
        table = Table("rank", "kernel", "stream", "score", box=None)
        for f in d.l3:  # the order of --json's l3.stragglers
            table.add_row(str(f.rank), f.kernel, str(f.stream), f"+{f.score:.0%}")
        console.print(table)
    elif "l3" in blind:
        console.print(f"[yellow]not judged[/yellow]: {blind['l3'].reason}")
    else:
        console.print("[green]no kernel stragglers[/green]")
    if d.excused:
        console.print(f"[dim]{len(d.excused)} slow collective kernel(s) excused: their ranks "
                      f"were waiting for a late peer[/dim]")

    console.rule("Verdict")
    for v in d.minor:
        console.print(f"[dim]not a verdict, too small to act on: rank {v.rank} ({v.cause}): "
                      f"{v.evidence}[/dim]")
    if not d.verdicts:
        if d.l1.regressions:
            step, ratio = d.l1.regressions[-1]
            console.print(f"[yellow]the whole job slowed at step {step} ({ratio:.2f}x)[/yellow]"
                          f"; no rank stands out: likely a link or a resource all ranks share "
                          f"(storage, network, the host's power or cooling)")
            return
        console.print(_no_verdict(list(blind.values())))
        return
    for v in d.verdicts:
        console.print(f"[bold]rank {v.rank}[/bold]: [magenta]{v.cause}[/magenta]. {v.evidence}")
    if d.suspects:
        console.rule("Suspects")
        for s in d.suspects:
            console.print(f"[bold]{s.unit_kind} {s.unit}[/bold]: {s.evidence}")
    console.print()
    console.print("[bold]Next[/bold]")
    seen = set()
    for v in d.verdicts:
        if v.cause in seen:
            continue
        seen.add(v.cause)
        group = ",".join(str(x.rank) for x in d.verdicts if x.cause == v.cause)
        console.print(f"- {v.cause}: " + NEXT_STEPS[v.cause].format(
            job=d.job, rank=v.rank, group=group))
    if blind:
        console.print(f"[dim]{_levels(list(blind.values()))} could not judge this job[/dim]")


def _levels(missing: list[NotJudged]) -> str:
    """'L1 (no step records) and L2 (no step records)'."""
    parts = [f"{n.level.upper()} ({n.reason})" for n in missing]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _no_verdict(missing: list[NotJudged]) -> str:
    """The verdict line when nothing was found: healthy only if every level could look."""
    if not missing:
        return "[green]healthy: nothing to act on[/green]"
    if len(missing) == 3:
        return (f"[red]nothing could be judged[/red]: {_levels(missing)}. Record steps "
                "(ARGUS_PHASES=1) and kernels (ARGUS_KERNELS=1) to diagnose this job.")
    judged = [lv.upper() for lv in ("l1", "l2", "l3") if lv not in {n.level for n in missing}]
    return (f"[yellow]no verdict[/yellow]: {' and '.join(judged)} found nothing, but "
            f"{_levels(missing)} could not judge this job: not a clean bill of health")
