"""Small helpers shared by the tests (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

from argus_core.stack.processes import free_port

__all__ = ["free_port", "wait_for"]


def wait_for(condition, what: str, timeout: float = 90.0, poll_s: float = 0.05):
    """Poll ``condition`` until it returns something truthy (returned); AssertionError naming
    ``what`` after ``timeout`` seconds (generous: a loaded machine is slow, never wrong)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll_s)


def seeds(default: int) -> range:
    """Seeds a statistical test runs over: ``default`` in CI, ``ARGUS_TEST_SEEDS`` when set
    (a larger count for a thorough run)."""
    import os

    return range(int(os.environ.get("ARGUS_TEST_SEEDS", default)))
