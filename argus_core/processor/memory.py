"""What the processor holds in memory, in bytes: one budget for every kind of record.

Kernel events are columns (28 bytes each: name id, stream, start and duration). Steps and stack
samples stay Python objects until their window is written; their sizes below were measured with
``tracemalloc`` on parsed records (a step with 4 phases: ~570 B; a stack sample of 4 frames:
~650 B). An open window also holds its gzip state, file handle and duration sketch (~160 KB
measured with 48 kernel groups, plus the sketch's own arrays as it grows). Estimates err on the
high side: the budget is a bound on RSS, not an exact count.
"""

from __future__ import annotations

from argus_core.schema import RankRecord, StackRecord, StepRecord

KERNEL_EVENT_BYTES = 28
"""Bytes per kernel event held as columns (int32 name id, int64 stream, start, duration)."""
WINDOW_BYTES = 192 * 1024
"""A window's writer state once the writer has started its file: gzip compressor state and
an empty sketch."""
WINDOW_STATE_BYTES = 4096
"""A window before the writer has started its file: its own objects and symbol table."""
NAME_BYTES = 160
"""A kernel name in a window's symbol table, besides its characters (str object, dict slot)."""
RANK_BYTES = 700
"""A (job, rank)'s state: identity record, watermark, closed windows, LRU slot."""
FLOOR_BYTES = 300
"""What a forgotten (job, rank) leaves behind: its closed windows, an ordered-dict slot."""


def step_bytes(step: StepRecord) -> int:
    """Estimated bytes of one parsed step record (its phases, and its peers: up to 4,096
    (phase, peer) entries, each a dict slot and a PeerTime)."""
    peers = sum(100 + 180 * len(by_peer) for by_peer in step.peers.values()) if step.peers else 0
    return 250 + sum(80 + len(name) for name in step.phases) + peers


def stack_bytes(stack: StackRecord) -> int:
    """Estimated bytes of one parsed stack sample."""
    return 300 + len(stack.thread) + sum(60 + len(frame) for frame in stack.frames)


def name_bytes(name: str) -> int:
    """Estimated bytes of one interned kernel name."""
    return NAME_BYTES + len(name)


def rank_bytes(identity: RankRecord | None) -> int:
    """Estimated bytes of one (job, rank)'s state."""
    if identity is None:
        return RANK_BYTES
    return (RANK_BYTES + len(identity.host) + len(identity.job)
            + sum(len(str(v)) + 64 for v in identity.placement.values()))
