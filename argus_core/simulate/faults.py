"""Faults the simulator can inject, and their one-line text form for ``argus simulate --fault``.

    compute:ranks=5:phases=attention*25,mlp*20:from=15     slow kernels of some phases
    link:ranks=4-7:axis=tp:factor=8:ops=AllGather*12:from=0  slow collectives on one axis
    link:ranks=5:axis=tp:factor=3:from=0:local=1           only these ranks' collective kernels
    stall:ranks=3:steps=12,27:seconds=2.5                 host-side stalls before some steps
    stall:ranks=1:from=8:seconds=0.12:before=dp           a stall before the dp all-reduce of
                                                            every step from step 8 on
    tail:ranks=5:kernel=dgrad:share=0.1:factor=6:from=0    a tenth of the executions of the
                                                            kernels named *dgrad* 6x slower
                                                            (a tail fault: medians unchanged;
                                                            spread evenly over the steps)

A ``link`` fault slows every member of the affected collective groups (a collective runs at
its slowest link); with ``local=1`` only the named ranks' collective kernels take longer (an
asymmetric transfer: nobody arrives late, yet some members' collectives are long).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fault:
    """One injected fault. ``kind`` is compute, link, stall or tail."""

    kind: str
    ranks: tuple[int, ...]
    phases: dict[str, float] = field(default_factory=dict)  # compute: phase -> slowdown
    axis: str = ""  # link: the axis whose collectives slow down
    factor: float = 1.0  # link: transfer-time multiplier
    ops: dict[str, float] = field(default_factory=dict)  # link: per-kernel-name overrides
    start: int = 0  # first affected step (compute, link, sustained stall)
    end: int | None = None  # first unaffected step, None = until the end
    steps: tuple[int, ...] = ()  # stall: the steps that stall (none listed: every step >= start)
    seconds: float = 0.0  # stall: length of each stall
    before: str = ""  # stall: the part of the step it delays ("" = the step's start)
    local: bool = False  # link: only the named ranks' kernels are slower
    kernel: str = ""  # tail: the kernels whose names contain this
    share: float = 0.0  # tail: the share of their executions slowed by ``factor``

    def active(self, step: int) -> bool:
        """Whether the fault applies at ``step``."""
        if self.kind == "stall" and self.steps:
            return step in self.steps
        return step >= self.start and (self.end is None or step < self.end)

    def __str__(self) -> str:
        ranks = _ranges(self.ranks)
        if self.kind == "compute":
            spec = ",".join(f"{p}*{f:g}" for p, f in self.phases.items())
            return f"compute:ranks={ranks}:phases={spec}:from={self.start}"
        if self.kind == "link":
            ops = "".join(f":ops={','.join(f'{o}*{f:g}' for o, f in self.ops.items())}"
                          for _ in [0] if self.ops)
            return (f"link:ranks={ranks}:axis={self.axis}:factor={self.factor:g}{ops}"
                    f":from={self.start}{':local=1' if self.local else ''}")
        if self.kind == "tail":
            return (f"tail:ranks={ranks}:kernel={self.kernel}:share={self.share:g}"
                    f":factor={self.factor:g}:from={self.start}")
        when = f"steps={_ranges(self.steps)}" if self.steps else f"from={self.start}"
        before = f":before={self.before}" if self.before else ""
        return f"stall:ranks={ranks}:{when}:seconds={self.seconds:g}{before}"


def _ranges(values: tuple[int, ...]) -> str:
    """(4, 5, 6, 7, 9) -> '4-7,9'."""
    parts: list[str] = []
    run: list[int] = []
    for v in [*values, None]:
        if run and (v is None or v != run[-1] + 1):
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
            run = []
        if v is not None:
            run.append(v)
    return ",".join(parts)


def _ranks(text: str) -> tuple[int, ...]:
    """'4-7,9' -> (4, 5, 6, 7, 9); refuses anything else with the offending part."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad rank or step list part {part!r} (expected N or N-M, N >= 0)")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return tuple(out)


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"local must be 0 or 1, got {text!r}")
    return text == "1"


def spec_fields(spec: str, parts: list[str]) -> dict[str, str]:
    """The ``key=value`` parts of a fault spec as a dict; raises ValueError naming a bad one."""
    fields: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"fault {spec!r}: expected key=value, got {part!r}")
        fields[key] = value
    return fields


def parse_fault(spec: str) -> Fault:
    """Parse the text form above; raises ValueError naming the bad part."""
    kind, *parts = spec.split(":")
    if kind not in ("compute", "link", "stall", "tail"):
        raise ValueError(f"fault {spec!r}: kind must be compute, link, stall or tail, "
                         f"not {kind!r}")
    fields = spec_fields(spec, parts)
    try:
        ranks = _ranks(fields.pop("ranks"))
        if kind == "stall" and "steps" not in fields and "from" not in fields:
            raise ValueError("a stall needs steps=N,M or from=N (every step from N on)")
        start = int(fields.pop("from", "0"))
        if kind == "compute":
            phases = {}
            for item in fields.pop("phases").split(","):
                phase, _, factor = item.partition("*")
                phases[phase] = float(factor)
            fault = Fault("compute", ranks, phases=phases, start=start)
        elif kind == "link":
            ops = {}
            for item in filter(None, fields.pop("ops", "").split(",")):
                op, _, factor = item.partition("*")
                ops[op] = float(factor)
            fault = Fault("link", ranks, axis=fields.pop("axis"),
                          factor=float(fields.pop("factor")), ops=ops, start=start,
                          local=_flag(fields.pop("local", "0")))
        elif kind == "tail":
            share = float(fields.pop("share"))
            if not 0 < share <= 1:
                raise ValueError(f"share must be in (0, 1], got {share:g}")
            fault = Fault("tail", ranks, kernel=fields.pop("kernel"), share=share,
                          factor=float(fields.pop("factor")), start=start)
        else:
            steps = _ranks(fields.pop("steps")) if "steps" in fields else ()
            fault = Fault("stall", ranks, steps=steps, start=start,
                          seconds=float(fields.pop("seconds")), before=fields.pop("before", ""))
    except KeyError as exc:
        raise ValueError(f"fault {spec!r}: missing {exc.args[0]}=") from None
    except ValueError as exc:
        raise ValueError(f"fault {spec!r}: {exc}") from None
    if fields:
        raise ValueError(f"fault {spec!r}: unknown key {sorted(fields)[0]!r}")
    return fault
