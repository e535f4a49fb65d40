"""The graph of a loaded Vector config and what would make it wrong or lossy.

Outputs follow Vector: a ``remap`` with ``reroute_dropped`` adds ``<id>.dropped``; a ``route``
has one output per route plus ``<id>._unmatched`` unless ``reroute_unmatched`` is false. An
input names a component (its default output) or ``component.output``.
"""

from __future__ import annotations

from collections import defaultdict, deque

from . import schema
from .config import components


def outputs(table: str, body: dict) -> list[str]:
    """Names of a component's outputs ("" is the default one); sinks have none."""
    kind = body.get("type")
    if table == "sinks":
        return []
    if kind == "remap":
        dropped = body.get("reroute_dropped", False) and (
            body.get("drop_on_error", False) or body.get("drop_on_abort", True))
        return ["", "dropped"] if dropped else [""]
    if kind == "route":
        names = list(body.get("route") or {})
        return names + (["_unmatched"] if body.get("reroute_unmatched", True) else [])
    if kind == "exclusive_route":
        names = [route["name"] for route in body.get("routes") or []]
        return [*names, "_unmatched"]
    return [""]


def output_ids(config: dict) -> dict[str, tuple[str, str]]:
    """Every input a component may name -> (component id, output name)."""
    found = {}
    for cid, (table, body) in components(config).items():
        for name in outputs(table, body):
            found[f"{cid}.{name}" if name else cid] = (cid, name)
    return found


def edges(config: dict) -> list[tuple[str, str]]:
    """(input as written, consuming component) for every input that exists."""
    known = output_ids(config)
    return [(ref, cid) for cid, (_, body) in components(config).items()
            for ref in body.get("inputs") or () if ref in known]


def problems(config: dict) -> list[str]:
    """Everything that would stop Vector from starting, or lose events silently.

    Unknown component types, inputs that name nothing, outputs nobody consumes (Vector only
    warns, and the events are gone), sources from which no sink can be reached, cycles.
    """
    found: list[str] = []
    known_types = schema.component_types()
    everything = components(config)
    known = output_ids(config)
    for cid, (table, body) in everything.items():
        if body.get("type") not in known_types[table]:
            found.append(f"{table}.{cid}: unknown type {body.get('type')!r}")
        if table != "sources" and not body.get("inputs"):
            found.append(f"{table}.{cid}: has no inputs")
        for ref in body.get("inputs") or ():
            if "*" in ref:
                found.append(f"{table}.{cid}: wildcard input {ref!r} is not checked here")
            elif ref not in known:
                found.append(f"{table}.{cid}: input {ref!r} doesn't match any component output")
    links = edges(config)
    consumed = {ref for ref, _ in links}
    for ref, (cid, _) in known.items():
        if ref not in consumed:
            found.append(f"{everything[cid][0]}.{cid}: output {ref!r} has no consumer")
    downstream = defaultdict(set)
    for ref, consumer in links:
        downstream[known[ref][0]].add(consumer)
    for cid, (table, _) in everything.items():
        if table == "sources" and not any(everything[c][0] == "sinks"
                                          for c in reachable(downstream, cid)):
            found.append(f"sources.{cid}: reaches no sink")
    if cycle := _cycle(downstream):
        found.append(f"cycle through {cycle}")
    return found


def reachable(downstream: dict[str, set[str]], start: str) -> set[str]:
    """Components reachable from ``start`` (not including it)."""
    seen: set[str] = set()
    queue = deque(downstream.get(start, ()))
    while queue:
        cid = queue.popleft()
        if cid not in seen:
            seen.add(cid)
            queue.extend(downstream.get(cid, ()))
    return seen


def _cycle(downstream: dict[str, set[str]]) -> str | None:
    """A component that can reach itself, if any."""
    return next((start for start in downstream if start in reachable(downstream, start)), None)


def path_exists(config: dict, start: str, end: str) -> bool:
    """Whether events leaving output ``start`` (as an input would name it) can reach ``end``."""
    known = output_ids(config)
    by_output, by_component = defaultdict(set), defaultdict(set)
    for ref, consumer in edges(config):
        by_output[ref].add(consumer)
        by_component[known[ref][0]].add(consumer)
    return any(c == end or end in reachable(by_component, c) for c in by_output.get(start, ()))
