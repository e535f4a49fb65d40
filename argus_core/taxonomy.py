"""What a phase or a kernel is: compute or communication, and on which parallel axis.

Communication phases are named ``{axis}-{operation}`` (``dp-allreduce``, ``tp-comm``), so the
collective's group is known; kernels are classified by name (NCCL/RCCL and collective names).
"""

from __future__ import annotations

import re

from argus_core.schema import AXES

_COMM_WORDS = re.compile(
    r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv|broadcast|"
    r"\bp2p\b|barrier|\bcomm\b|collective", re.IGNORECASE)


# what the exporters name the operations they time (``{axis}-{op}``, ``pg-send``): the same
# set as ``argus_exporters.collectives.OPS`` (a test holds them equal)
COLLECTIVE_OPS = frozenset({"allreduce", "allgather", "reducescatter", "alltoall", "broadcast",
                            "reduce", "gather", "scatter", "send", "recv", "barrier"})


def phase_axis(name: str) -> str | None:
    """The parallel axis a phase belongs to, from an ``{axis}-`` prefix, else None."""
    head, sep, _ = name.partition("-")
    return head if sep and head in AXES else None


POINT_TO_POINT_OPS = frozenset({"send", "recv"})
"""Operations between two ranks, not a whole group: judged per link, never along their axis."""


def phase_op(name: str) -> str:
    """The operation a phase names after its last ``-`` (``pp-send`` -> ``send``)."""
    return name.rpartition("-")[2]


def is_point_to_point(name: str) -> bool:
    """True for a send or recv phase (``pp-send``): data between two ranks, whose time
    depends on the pair (a pipeline stage's position), not on a group all members share."""
    return phase_op(name) in POINT_TO_POINT_OPS


def is_comm_phase(name: str) -> bool:
    """True for communication phases (axis-prefixed or named after a collective)."""
    return (phase_axis(name) is not None or name.rpartition("-")[2] in COLLECTIVE_OPS
            or bool(_COMM_WORDS.search(name)))


def is_comm_kernel(name: str) -> bool:
    """True for collective / point-to-point communication kernels."""
    return bool(_COMM_WORDS.search(name))
