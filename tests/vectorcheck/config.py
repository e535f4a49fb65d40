"""Load Vector config files as ``vector --config a.yaml --config b.yaml`` does.

Vector parses each file, interpolates environment variables into every string (and key), turns
a string that now reads as an integer, float or boolean into that type, and merges the files:
a component id defined twice, or a global option set to two different values, is an error.
A variable without a default that is not set is an error too (``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?message}``, ``${VAR?message}``, ``$VAR``; ``$$`` is a literal ``$``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
VECTOR_DIR = REPO / "vector"
COMPONENT_TABLES = ("sources", "transforms", "sinks")

# Vector's pattern (src/config/loading/interpolation.rs); ``[[:word:]]`` is ASCII there.
_VARIABLE = re.compile(r"\$\$|\$([A-Za-z0-9_.]+)|\$\{([A-Za-z0-9_.]+)(?:(:?-|:?\?)([^}]*))?\}")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
    re.IGNORECASE)


class ConfigError(ValueError):
    """A config that Vector would refuse to load; the message says which file and what."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Replace environment variables in one string; ConfigError lists the missing ones."""
    missing: list[str] = []

    def value(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(2)
        flag, default = match.group(3) or "", match.group(4) or ""
        found = env.get(name)
        if flag == ":-":
            return found if found else default
        if flag == "-":
            return default if found is None else found
        if flag in (":?", "?") and (found is None or (flag == ":?" and not found)):
            missing.append(f"{name} ({default})" if default else name)
            return ""
        if found is None:
            missing.append(name)
            return ""
        return found

    result = _VARIABLE.sub(value, text)
    if missing:
        raise ConfigError(f"environment variable(s) required but not set: {', '.join(missing)}")
    return result


def _coerce(text: str) -> Any:
    """What Vector does with an interpolated string: i64, then f64, then bool, else string."""
    if _INTEGER.fullmatch(text) and -(2**63) <= int(text) < 2**63:
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    return text


def _interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, dict):
        return {interpolate(str(k), env): _interpolate_tree(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, env) for v in node]
    if isinstance(node, str):
        return _coerce(interpolate(node, env))
    return node


def load_file(path: Path, env: Mapping[str, str] | None = None) -> dict:
    """One file, parsed and interpolated (``os.environ`` unless ``env`` is given)."""
    env = os.environ if env is None else env
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return _interpolate_tree(data, env)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def merge(named: Iterable[tuple[str, dict]]) -> dict:
    """Merge parsed files as Vector's config builder does; ConfigError on any clash."""
    merged: dict[str, Any] = {table: {} for table in COMPONENT_TABLES}
    merged["tests"] = []
    origin: dict[tuple[str, str], str] = {}
    for name, data in named:
        for key, value in data.items():
            if key in COMPONENT_TABLES:
                for component, body in (value or {}).items():
                    if (key, component) in origin:
                        raise ConfigError(f"{name}: duplicate {key[:-1]} id {component!r} "
                                          f"(also in {origin[key, component]})")
                    origin[key, component] = name
                    merged[key][component] = body
            elif key == "tests":
                merged["tests"].extend(value or [])
            elif key in merged and merged[key] != value:
                raise ConfigError(f"{name}: global option {key!r} conflicts with "
                                  f"{origin.get(('global', key))}")
            else:
                origin["global", key] = name
                merged[key] = value
    return merged


def load(*names: str, env: Mapping[str, str] | None = None) -> dict:
    """Files of ``vector/`` (``"agent.yaml"``...) loaded and merged as one running config."""
    return merge((name, load_file(VECTOR_DIR / name, env)) for name in names)


def components(config: dict) -> dict[str, tuple[str, dict]]:
    """Component id -> (``sources``/``transforms``/``sinks``, its body)."""
    return {cid: (table, body) for table in COMPONENT_TABLES
            for cid, body in (config.get(table) or {}).items()}
