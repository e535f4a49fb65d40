"""Check dashboard JSON against grafana-foundation-sdk's models of Grafana 11.6.

The SDK is generated from Grafana's own schemas (CUE kinds), so its model classes are the
schema: a dashboard that decodes into them and encodes back to the same JSON uses only fields
Grafana 11.6 knows (``from_json`` drops anything it does not model). On top of that round trip
this module checks what the models hold as plain values: enum fields hold members of their
enum, panel types and query types are registered plugins, every datasource reference is the
dashboard's ``$datasource`` Prometheus, every ``$variable`` a query uses is declared, and the
parts the models keep as raw dicts (data links, transformations) decode into their models too.
"""

from __future__ import annotations

import enum
import json
import re
import types
import typing
from functools import cache
from typing import Any

from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

BUILTIN_VARIABLES = frozenset({
    "__interval", "__interval_ms", "__rate_interval", "__range", "__range_s", "__range_ms",
    "__from", "__to", "__dashboard", "__org", "__user", "__timeFilter", "__url_time_range",
    "__field", "__value", "__data", "__series", "__all_variables", "timeFilter"})
"""Grafana's built-in and data-link variables (``${__field.labels.rank}`` and the like)."""

_VARIABLE = re.compile(r"\$(?:\{([A-Za-z0-9_.]+)(?::[a-z]+)?\}|([A-Za-z_][A-Za-z0-9_]*))")
TRANSFORMATIONS = frozenset({
    "merge", "organize", "groupingToMatrix", "sortBy", "joinByField", "labelsToFields",
    "reduce", "filterFieldsByName", "seriesToRows", "calculateField"})
"""Transformation ids the dashboards may use (all present in Grafana 11.6)."""


@cache
def _registered() -> None:
    plugins.register_default_plugins()


def round_trip(data: dict[str, Any]) -> dict[str, Any]:
    """Decode JSON into the SDK's Dashboard model and encode it back."""
    _registered()
    return json.loads(json.dumps(dm.Dashboard.from_json(data), cls=JSONEncoder))


def problems(data: dict[str, Any]) -> list[str]:
    """Everything in a dashboard's JSON that Grafana 11.6's schema would not accept."""
    _registered()
    found: list[str] = []
    again = round_trip(data)
    if again != data:
        found += [f"round trip changes {path}" for path in _differences(data, again, "$")]
    model = dm.Dashboard.from_json(data)
    found += _check_model(model, "$")
    found += _check_panels(data)
    found += _check_variables(data)
    return found


# -- the models as schema --------------------------------------------------------------------
def _differences(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in b:
                out.append(f"{path}.{key} (unknown field, dropped)")
            elif key not in a:
                out.append(f"{path}.{key} (added by the model)")
            else:
                out += _differences(a[key], b[key], f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


@cache
def _hints(cls: type) -> dict[str, Any]:
    module = __import__(cls.__module__, fromlist=["_"])
    return typing.get_type_hints(cls, globalns=vars(module))


def _check_model(obj: Any, path: str) -> list[str]:
    """Every attribute of a model object against its type hint (enums, nested models, lists)."""
    found = []
    for name, value in vars(obj).items():
        hint = _hints(type(obj)).get(name)
        if hint is not None and value is not None:
            found += _check_value(value, hint, f"{path}.{name}")
    return found


def _check_value(value: Any, hint: Any, path: str) -> list[str]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        results = [_check_value(value, option, path) for option in options]
        return [] if any(not r for r in results) else results[0]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        (item,) = typing.get_args(hint) or (Any,)
        return [p for i, v in enumerate(value) for p in _check_value(v, item, f"{path}[{i}]")]
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return [] if value in allowed else [f"{path}: {value!r} not one of {allowed}"]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = {member.value for member in hint}
        raw = value.value if isinstance(value, enum.Enum) else value
        return [] if raw in allowed else [f"{path}: {raw!r} is not a {hint.__name__} "
                                          f"({', '.join(map(str, sorted(allowed, key=str)))})"]
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        if isinstance(value, hint):
            return _check_model(value, path)
        if isinstance(value, dict):  # kept raw by from_json (links, transformations): see below
            return []
        return [f"{path}: expected {hint.__name__}, got {type(value).__name__}"]
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected a number, got {value!r}"]
    if hint in (int, str, bool):
        return [] if isinstance(value, hint) else [f"{path}: expected {hint.__name__}, "
                                                   f"got {value!r}"]
    if hasattr(value, "to_json") and hasattr(type(value), "from_json"):
        return _check_model(value, path)  # typed ``object`` (panel options, custom config)
    return []  # Any / aliases the models keep as raw JSON


# -- what the models keep raw ------------------------------------------------------------------
def _panels(data: dict[str, Any]):
    for panel in data.get("panels", ()):
        yield panel
        yield from panel.get("panels", ())


def _check_panels(data: dict[str, Any]) -> list[str]:
    found = []
    known = set(runtime.Runtime().panelcfg_variants) | {"row"}
    ids = [panel.get("id") for panel in _panels(data)]
    if len(set(ids)) != len(ids) or None in ids:
        found.append(f"panel ids must be present and unique, got {ids}")
    for panel in _panels(data):
        where = f"panel {panel.get('id')} ({panel.get('title')!r})"
        if panel.get("type") not in known:
            found.append(f"{where}: unknown panel type {panel.get('type')!r}")
        if panel.get("type") == "row":
            continue
        if not panel.get("description"):
            found.append(f"{where}: no description")
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if not defaults.get("unit"):
            found.append(f"{where}: no unit")
        if not defaults.get("thresholds"):
            found.append(f"{where}: no thresholds")
        found += _check_datasource(panel.get("datasource"), where)
        if not panel.get("targets"):
            found.append(f"{where}: no queries")
        for target in panel.get("targets", ()):
            found += _check_datasource(target.get("datasource"), f"{where} query")
            decoded = runtime.dataquery_from_json(target, "")
            if not isinstance(decoded, pm.Dataquery):
                found.append(f"{where}: query is not a Prometheus query")
            elif not target.get("expr"):
                found.append(f"{where}: query {target.get('refId')} has no expr")
        for item in (*panel.get("links", ()), *defaults.get("links", ())):
            if dm.DashboardLink.from_json(item).to_json().keys() != item.keys():
                found.append(f"{where}: link {item.get('title')!r} has unknown fields")
            if not item.get("url"):
                found.append(f"{where}: link {item.get('title')!r} has no url")
        for item in panel.get("transformations", ()):
            config = dm.DataTransformerConfig.from_json(item)
            if json.loads(json.dumps(config, cls=JSONEncoder)) != item:
                found.append(f"{where}: transformation {item} has unknown fields")
            if config.id_val not in TRANSFORMATIONS:
                found.append(f"{where}: unknown transformation {config.id_val!r}")
    for annotation in data.get("annotations", {}).get("list", ()):
        found += _check_datasource(annotation.get("datasource"),
                                   f"annotation {annotation.get('name')!r}")
    return found


def _check_datasource(ref: Any, where: str) -> list[str]:
    if ref != {"type": "prometheus", "uid": "${datasource}"}:
        return [f"{where}: datasource must be the $datasource Prometheus, got {ref!r}"]
    return []


def _check_variables(data: dict[str, Any]) -> list[str]:
    found = []
    variables = data.get("templating", {}).get("list", [])
    declared = {v.get("name") for v in variables}
    sources = [v for v in variables if v.get("name") == "datasource"]
    if len(sources) != 1 or sources[0].get("type") != "datasource" \
            or sources[0].get("query") != "prometheus":
        found.append("the dashboard needs one 'datasource' variable of type datasource "
                     "(prometheus)")
    for variable in variables:
        if variable.get("type") == "query":
            found += _check_datasource(variable.get("datasource"),
                                       f"variable {variable.get('name')!r}")
    for text, where in _texts(data):
        for braced, bare in _VARIABLE.findall(text):
            name = (braced or bare).split(".")[0]
            if name not in declared and name not in BUILTIN_VARIABLES:
                found.append(f"{where}: uses ${name}, which is not a declared variable")
    return found


def _texts(data: dict[str, Any]):
    """Every string Grafana interpolates: queries, legends, titles, link URLs."""
    for variable in data.get("templating", {}).get("list", []):
        if isinstance(variable.get("query"), str):
            yield variable["query"], f"variable {variable.get('name')!r}"
    for annotation in data.get("annotations", {}).get("list", ()):
        yield annotation.get("expr") or "", f"annotation {annotation.get('name')!r}"
    for panel in _panels(data):
        where = f"panel {panel.get('id')} ({panel.get('title')!r})"
        yield panel.get("title") or "", where
        for target in panel.get("targets", ()):
            yield target.get("expr") or "", where
            yield target.get("legendFormat") or "", where
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        for item in (*panel.get("links", ()), *defaults.get("links", ())):
            yield item.get("url") or "", where
            yield item.get("title") or "", where
