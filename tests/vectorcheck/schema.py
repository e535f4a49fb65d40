"""Vector's own JSON schema (vendored in ``vector/schema/``) applied to a loaded config."""

from __future__ import annotations

import functools
import json

import jsonschema

from .config import VECTOR_DIR

SCHEMA_PATH = VECTOR_DIR / "schema" / "vector.schema.json"
_TYPE_TABLES = {"sources": "vector::sources::Sources",
                "transforms": "vector::transforms::Transforms",
                "sinks": "vector::sinks::Sinks"}


@functools.cache
def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@functools.cache
def validator() -> jsonschema.Draft201909Validator:
    """A validator for the schema's draft (2019-09), built once per process."""
    return jsonschema.Draft201909Validator(_schema())


def check_schema_itself() -> None:
    """Raise if the vendored file is not a valid draft 2019-09 schema (slow: ~2 s)."""
    jsonschema.Draft201909Validator.check_schema(_schema())


def errors(config: dict) -> list[str]:
    """Schema violations, most specific first, each as ``path.to.field: message``.

    A bad component also makes its parents fail ("unevaluated properties"); only the deepest
    errors of each branch are kept so the message points at the field that is wrong.
    """
    body = {k: v for k, v in config.items() if k != "tests" or v}
    found = list(validator().iter_errors(body))
    found += [leaf for error in found for leaf in _leaves(error)]
    deepest = max((len(e.absolute_path) for e in found), default=0)
    keep = [e for e in found if len(e.absolute_path) == deepest]
    return sorted({f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}"
                   for e in keep})


def _leaves(error: jsonschema.ValidationError):
    for child in error.context or ():
        yield child
        yield from _leaves(child)


@functools.cache
def component_types() -> dict[str, frozenset[str]]:
    """``{"sources": {...}, "transforms": {...}, "sinks": {...}}``: every type the schema knows."""
    definitions = _schema()["definitions"]
    return {table: frozenset(_type_const(item) for item in definitions[name]["oneOf"])
            for table, name in _TYPE_TABLES.items()}


def _type_const(item: dict) -> str:
    for part in item.get("allOf", [item]):
        const = part.get("properties", {}).get("type", {}).get("const")
        if const:
            return const
    raise ValueError(f"no type constant in {item.get('description', item)!r:.80}")
