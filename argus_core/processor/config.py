"""Everything ``argus processor`` can be told, with the defaults docs/processor.md documents."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAX_SPOOL_BYTES = 4 << 30
"""Upload spool cap for a processor host (4 GiB, as ``--spool-max-mb`` defaults)."""
MAX_MEMBERS = 65_536
"""Most gzip members or zstd frames one body may hold (Vector sends one; ``cat``-ed spool
files a few thousand). Beyond it the body is refused before more work is spent on it."""

DURABILITY = ("fsync", "write", "memory")
"""``fsync``: a 2xx waits until the records' log entry is fsynced (nothing acknowledged is lost
even to a power cut). ``write``: a 2xx waits until it is written to the log (nothing is lost to
a process crash; a machine crash can lose the last ``wal_sync_interval_s`` of it). ``memory``:
no log (a crash loses the records of open windows; for benchmarks and throw-away runs)."""


@dataclass(frozen=True)
class ProcessorConfig:
    """Settings of one processor; ``validate`` names the first bad one."""

    host: str = "127.0.0.1"
    port: int = 9700
    store: str = "file:///var/lib/argus/traces"
    spool_dir: str = "/var/lib/argus/spool"
    max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES
    token: str | None = None  # bearer token of POST /v1/records
    read_token: str | None = None  # bearer token of /v1/traces/* (None: reads are open)
    insecure: bool = False  # allow a non-loopback address without a token
    window_s: float = 60.0
    grace_s: float = 10.0
    # intake
    max_body_bytes: int = 64 << 20  # decompressed
    max_members: int = MAX_MEMBERS  # gzip members or zstd frames per body
    max_skew_s: float = 300.0  # records stamped further ahead of our clock are refused
    max_age_s: float = 86_400.0  # records older than this are refused
    intake_threads: int = 2  # decompression and parsing, off the event loop
    # memory and durability
    memory_budget_bytes: int = 512 << 20  # everything held, every kind, estimated
    max_pending_windows: int = 64  # closed windows waiting to be written
    max_windows_per_rank: int = 16  # open at once; beyond, a rank's oldest closes early
    max_body_windows: int = 1024  # windows one body may open; beyond, it is refused (413)
    chunk_events: int = 65_536  # a window's kernels go to disk and sketch in chunks this big
    chunk_bytes: int = 1 << 20  # ... and its stack samples once they hold this many bytes
    durability: str = "write"
    wal_sync_interval_s: float = 1.0  # "write": fsync the log this often
    wal_segment_bytes: int = 64 << 20
    wal_max_bytes: int = 8 << 30  # log on disk beyond which intake answers 503
    # forgetting
    state_ttl_s: float = 3600.0  # a rank's identity, state and summaries after its last record
    max_ranks: int = 65_536  # (job, rank) pairs remembered; least recently seen go first
    # connections
    read_timeout_s: float = 10.0  # longest wait for the next piece of a request body
    idle_timeout_s: float = 30.0  # a connection must send complete headers within this
    max_connections: int = 1024
    top_k: int = 32
    max_metrics_series: int = 300_000  # kernel summary series on /metrics; ranks beyond left out
    retry_after_s: int = 1

    def validate(self) -> ProcessorConfig:
        """Return self, or raise ValueError naming the first setting out of range."""
        if self.durability not in DURABILITY:
            raise ValueError(f"durability must be one of {', '.join(DURABILITY)}, "
                             f"not {self.durability!r}")
        positive = ("window_s", "max_body_bytes", "max_members", "max_skew_s", "max_age_s",
                    "intake_threads", "memory_budget_bytes", "max_pending_windows",
                    "max_windows_per_rank", "max_body_windows",
                    "chunk_events", "chunk_bytes", "wal_sync_interval_s", "wal_segment_bytes",
                    "wal_max_bytes", "state_ttl_s", "max_ranks", "read_timeout_s",
                    "idle_timeout_s", "max_connections", "top_k", "max_spool_bytes",
                    "max_metrics_series")
        for name in (*positive, "grace_s"):  # NaN would pass every comparison below
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.port <= 65_535:
            raise ValueError(f"port must be from 0 to 65535, got {self.port}")
        if self.max_windows_per_rank < 2:
            raise ValueError(f"max_windows_per_rank must be >= 2 (the current window and the "
                             f"one in its grace period), got {self.max_windows_per_rank}")
        if self.grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {self.grace_s}")
        if not self.token and not self.insecure and not is_loopback(self.host):
            raise ValueError(f"listening on {self.host or 'every address'} without a token: "
                             f"anyone who reaches the port could post records; set the token "
                             f"variable (--token-env, default ARGUS_PROCESSOR_TOKEN) or pass "
                             f"--insecure")
        return self


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) reaches only this machine."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name (resolving to who knows what) or every address ("")
