"""Which processes trace kernels (pure rules, testable on a CPU).

DataLoader workers never; otherwise only a training rank (RANK or LOCAL_RANK in the
environment, or ``settings.extra["training_rank"]``). A process whose parent is itself a
training rank (a Python process with RANK/LOCAL_RANK that is not a launcher such as torchrun) is
a helper: an inductor compile worker, a DataLoader worker, any subprocess. Where the parent
cannot be read, a ``multiprocessing`` child outside torchrun is taken for a helper.
``settings.extra["training_rank"] = True/False`` overrides the rule.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch",
              "torch/distributed/run.py", "torch/distributed/launch.py", "deepspeed",
              "accelerate")


@dataclass(frozen=True)
class ParentInfo:
    """What we can see of the parent process: its initial environment keys and command line."""

    env_keys: frozenset[str]
    cmdline: tuple[str, ...]


def parent_info() -> ParentInfo | None:
    """The parent's environment keys and command line from /proc, or None."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/environ", "rb") as f:
            environ = f.read()
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    keys = frozenset(item.split(b"=", 1)[0].decode("utf-8", "replace")
                     for item in environ.split(b"\0") if item)
    argv = tuple(a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a)
    return ParentInfo(keys, argv)


def training_process(env: Mapping[str, str], *, forced: bool | None = None,
                     worker_info: object = None, parent: ParentInfo | None = None,
                     mp_child: bool = False, argv0: str = "") -> tuple[bool, str]:
    """Whether this process is a training rank that should trace kernels, and why (pure).

    The rule is in the module docstring; ``forced`` is ``settings.extra["training_rank"]``.
    """
    if worker_info is not None:
        return False, "DataLoader worker process"
    if forced is not None:
        return forced, "settings.extra['training_rank'] = " + str(forced)
    if "RANK" not in env and "LOCAL_RANK" not in env:
        return False, "not a training rank (no RANK or LOCAL_RANK in the environment)"
    if "compile_worker" in argv0 or "_inductor" in argv0:
        return False, "inductor compile worker"
    if parent is not None:
        command = " ".join(parent.cmdline)
        if any(launcher in command for launcher in _LAUNCHERS):
            return True, "training rank (child of a launcher)"
        program = os.path.basename(parent.cmdline[0]) if parent.cmdline else ""
        parent_is_rank = "RANK" in parent.env_keys or "LOCAL_RANK" in parent.env_keys
        if parent_is_rank and program.startswith("python"):
            return False, "child of a training rank (compile worker, DataLoader worker or helper)"
        return True, "training rank"
    if mp_child and "TORCHELASTIC_RUN_ID" not in env:
        return False, "multiprocessing child outside torchrun (compile or DataLoader worker)"
    return True, "training rank"


def dataloader_worker_info() -> object:
    """torch's DataLoader worker info in a worker process, else None."""
    torch = sys.modules.get("torch")
    if torch is None or "torch.utils.data" not in sys.modules:
        return None
    try:
        return torch.utils.data.get_worker_info()
    except Exception:
        return None


def this_process(env: Mapping[str, str], forced: bool | None) -> tuple[bool, str]:
    """``training_process`` for the running process (parent, DataLoader, multiprocessing)."""
    return training_process(env, forced=forced, worker_info=dataloader_worker_info(),
                            parent=parent_info(),
                            mp_child=multiprocessing.parent_process() is not None,
                            argv0=sys.argv[0] if sys.argv else "")
