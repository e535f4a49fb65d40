"""Events pushed through a config's transforms, and its ``tests:`` blocks executed that way.

Only the transforms Argus configs use between sources and sinks are simulated: ``remap``
(drop_on_error / drop_on_abort / reroute_dropped), ``route`` (every matching route gets a
copy; ``_unmatched`` otherwise) and ``filter``. Events reaching any other component stop there;
a test that extracts from such a component is reported as not runnable here. The checks follow
Vector's unit-test sink: every condition of an output must hold for at least one of its events.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from datetime import UTC, datetime

from . import vrl
from .config import components
from .topology import edges

SIMULATED = ("remap", "route", "filter")


class Flow:
    """A config's transforms, ready to take events at any of them."""

    def __init__(self, config: dict):
        self.config = config
        self.components = components(config)
        self.consumers: dict[str, list[str]] = defaultdict(list)
        for ref, consumer in edges(config):
            self.consumers[ref].append(consumer)

    def push(self, insert_at: str, events: list[dict]) -> dict[str, list[dict]]:
        """Events out of every output they reached: ``{"route.kernels": [...], ...}``."""
        collected: dict[str, list[dict]] = defaultdict(list)
        for event in events:
            self._deliver(insert_at, copy.deepcopy(event), collected)
        return collected

    def _emit(self, cid: str, output: str, event: dict, collected) -> None:
        ref = f"{cid}.{output}" if output else cid
        collected[ref].append(event)
        for consumer in self.consumers.get(ref, ()):
            self._deliver(consumer, copy.deepcopy(event), collected)

    def _deliver(self, cid: str, event: dict, collected) -> None:
        table, body = self.components[cid]
        kind = body.get("type")
        if table != "transforms" or kind not in SIMULATED:
            collected[f"<reached {cid}>"].append(event)
            return
        if kind == "remap":
            outcome = vrl.remap(body, event)
            if outcome.event is not None:
                self._emit(cid, "", outcome.event, collected)
            if outcome.dropped is not None:
                self._emit(cid, "dropped", outcome.dropped, collected)
        elif kind == "filter":
            if vrl.condition(vrl.condition_source(body["condition"]), event)[0]:
                self._emit(cid, "", event, collected)
        else:  # route
            matched = False
            for name, condition in (body.get("route") or {}).items():
                if vrl.condition(vrl.condition_source(condition), event)[0]:
                    matched = True
                    self._emit(cid, name, copy.deepcopy(event), collected)
            if not matched and body.get("reroute_unmatched", True):
                self._emit(cid, "_unmatched", event, collected)


def input_event(item: dict) -> dict:
    """The event a ``tests:`` input describes (``vrl``, ``log``, ``raw``, ``metric``)."""
    kind = item.get("type", "raw")
    if kind == "vrl":
        return vrl.event_from_input(item["source"])
    now = datetime.now(UTC).isoformat()
    if kind == "raw":
        return {"message": item["value"], "timestamp": now}
    if kind == "log":  # Vector starts from an empty legacy log: message "" and a timestamp
        event: dict = {"message": "", "timestamp": now}
        for path, value in (item.get("log_fields") or {}).items():
            node = event
            *parents, leaf = str(path).split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return event
    if kind == "metric":  # what VRL sees of a metric: name, namespace, kind, type, tags
        metric = item["metric"]
        kinds = [k for k in ("counter", "gauge", "set", "distribution", "aggregated_histogram",
                             "aggregated_summary") if k in metric]
        view = {"name": metric["name"], "kind": metric["kind"], "type": kinds[0]}
        view.update({k: metric[k] for k in ("namespace", "tags") if metric.get(k)})
        return view
    raise ValueError(f"input type {kind!r} is not simulated here")


def run(config: dict, test: dict) -> list[str]:
    """Run one ``tests:`` entry; the list of failures (empty when it passes)."""
    flow = Flow(config)
    inputs = list(test.get("inputs") or []) + ([test["input"]] if test.get("input") else [])
    if not inputs:
        return ["must specify at least one input"]
    if not test.get("outputs") and not test.get("no_outputs_from"):
        return ["unit test must contain at least one of `outputs` or `no_outputs_from`"]
    collected: dict[str, list[dict]] = defaultdict(list)
    for item in inputs:
        target = item["insert_at"]
        if flow.components.get(target, ("",))[0] != "transforms":
            return [f"unable to locate target transform {target!r}"]
        for ref, events in flow.push(target, [input_event(item)]).items():
            collected[ref].extend(events)
    errors = []
    for output in test.get("outputs") or []:
        refs = output["extract_from"]
        refs = [refs] if isinstance(refs, str) else refs
        for ref in refs:
            cid = ref.split(".")[0]
            if flow.components.get(cid, ("", {}))[1].get("type") not in SIMULATED:
                errors.append(f"{ref}: cannot be extracted here (not a simulated transform)")
        events = [e for ref in refs for e in collected.get(ref, [])]
        if not events:
            errors.append(f"checks for {refs} failed: no events received")
            continue
        for c, cond in enumerate(output.get("conditions") or []):
            verdicts = [vrl.condition(vrl.condition_source(cond), e) for e in events]
            if not any(ok for ok, _ in verdicts):
                errors.append(f"{refs} condition[{c}]: {verdicts[-1][1]}")
    for ref in test.get("no_outputs_from") or []:
        if collected.get(ref):
            errors.append(f"check for {ref} failed: expected no outputs, got "
                          f"{len(collected[ref])}")
    return errors
