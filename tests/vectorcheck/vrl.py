"""Every VRL program of a config, compiled and run with pyvrl under Vector's semantics.

pyvrl (``pyvrl.Transform(source).remap(event)``) compiles a program and returns the value of
its last expression; a failed ``!`` call or an ``abort`` raises ``ValueError("remap failure:
...")``. Vector's ``remap`` emits the event as the program leaves it, so a remap program is run
with ``.`` appended; a condition (route, filter, test output, ``http_server`` custom auth) is
the program's value, which Vector requires to be a boolean.
"""

from __future__ import annotations

import copy
import functools
import platform
import sys
from dataclasses import dataclass

import pytest

from .config import components

try:
    import pyvrl
except ImportError:  # pragma: no cover - depends on the platform
    pyvrl = None


def require() -> None:
    """Skip the calling test module where pyVRL has no wheel (it ships one: CPython 3.11,
    x86_64 Linux); fail loudly where it should be installed but is not."""
    if pyvrl is not None:
        return
    supported = (sys.version_info[:2] == (3, 11) and platform.machine() == "x86_64"
                 and sys.platform == "linux")
    if supported:
        raise RuntimeError("pyVRL is missing: install the dev extra (pip install -e '.[dev]')")
    pytest.skip("pyVRL has no wheel for this platform (CPython 3.11 x86_64 Linux only)",
                allow_module_level=True)


class VrlError(AssertionError):
    """A program that does not compile, or a condition that does not return a boolean."""


@dataclass(frozen=True)
class Program:
    """One VRL program and where it sits in the config."""

    where: str  # e.g. "transforms.records_valid.source"
    source: str
    role: str  # remap | condition | auth | test_input


@dataclass(frozen=True)
class RemapOutcome:
    """What a ``remap`` transform does with one event."""

    event: dict | None  # on the default output (None: dropped)
    dropped: dict | None  # on ``<id>.dropped`` (the original event), with reroute_dropped
    reason: str = ""  # "abort" or "error" when the program failed
    message: str = ""  # the abort message or error, as Vector's dropped metadata carries it


@functools.cache
def compiled(source: str) -> pyvrl.Transform:
    """The compiled program; VrlError carries the compiler's diagnostic."""
    try:
        return pyvrl.Transform(source)
    except ValueError as exc:
        raise VrlError(str(exc)) from None


def condition_source(condition) -> str | None:
    if isinstance(condition, str):
        return condition
    if isinstance(condition, dict) and condition.get("type", "vrl") == "vrl":
        return condition.get("source")
    return None


def programs(config: dict) -> list[Program]:
    """Every VRL program of a loaded config: remaps, route/filter conditions, custom auth,
    and the ``tests:`` blocks' ``vrl`` inputs and conditions."""
    found = []
    for cid, (table, body) in components(config).items():
        kind = body.get("type")
        if kind == "remap":
            if "file" in body or "files" in body:
                raise VrlError(f"{table}.{cid}: keep VRL inline (Vector resolves `file` against "
                               "its working directory, not the config's)")
            found.append(Program(f"{table}.{cid}.source", body["source"], "remap"))
        elif kind == "route":
            for name, condition in (body.get("route") or {}).items():
                found.append(Program(f"{table}.{cid}.route.{name}",
                                     condition_source(condition), "condition"))
        elif kind == "filter":
            found.append(Program(f"{table}.{cid}.condition",
                                 condition_source(body.get("condition")), "condition"))
        auth = body.get("auth") or {}
        if table == "sources" and auth.get("strategy") == "custom":
            found.append(Program(f"{table}.{cid}.auth.source", auth["source"], "auth"))
    for t, test in enumerate(config.get("tests") or []):
        for i, item in enumerate(test.get("inputs") or []):
            if item.get("type") == "vrl":
                found.append(Program(f"tests[{t}].inputs[{i}].source", item["source"],
                                     "test_input"))
        for o, output in enumerate(test.get("outputs") or []):
            for c, condition in enumerate(output.get("conditions") or []):
                found.append(Program(f"tests[{t}].outputs[{o}].conditions[{c}]",
                                     condition_source(condition), "condition"))
    missing = [p.where for p in found if not p.source]
    if missing:
        raise VrlError(f"not VRL (or empty): {', '.join(missing)}")
    return found


def remap(body: dict, event: dict) -> RemapOutcome:
    """Run a ``remap`` transform's program on one event, with its drop/reroute settings."""
    try:
        out = compiled(body["source"] + "\n.").remap(copy.deepcopy(event))
    except ValueError as exc:
        message = str(exc).removeprefix("remap failure: ")
        reason = "error" if message.startswith("function call error") else "abort"
        drop = (body.get("drop_on_error", False) if reason == "error"
                else body.get("drop_on_abort", True))
        if not drop:  # Vector forwards the event unchanged
            return RemapOutcome(copy.deepcopy(event), None, reason, message)
        rerouted = copy.deepcopy(event) if body.get("reroute_dropped", False) else None
        return RemapOutcome(None, rerouted, reason, message)
    return RemapOutcome(out, None)


def condition(source: str, event: dict) -> tuple[bool, str]:
    """(passed, why not): a condition's verdict on one event, as Vector's VRL condition gives
    it (a runtime error or ``false`` fails it; a non-boolean is a config error)."""
    try:
        value = compiled(source).remap(copy.deepcopy(event))
    except ValueError as exc:
        return False, str(exc).removeprefix("remap failure: ")
    if not isinstance(value, bool):
        raise VrlError(f"condition returned {type(value).__name__} {value!r:.60}, not a boolean: "
                       f"{source!r:.80}")
    return value, "" if value else "source execution resolved to false"


def event_from_input(source: str) -> dict:
    """A ``tests:`` input of type ``vrl``: the event its program builds from ``{}``."""
    return compiled(source + "\n.").remap({})
