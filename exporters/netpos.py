"""Where a host sits in the network (``rack``, ``leaf``, ``spine``), from what operators have.

Three sources, tried in this order; the first that places the host wins:

1. ``ARGUS_TOPOLOGY``: a YAML map, the host by name, else the first glob that matches it::

       hosts:
         h064: {rack: r07, leaf: leaf-07, spine: spine-1}
       patterns:
         - {match: "h0[6-7]*", rack: r07, leaf: leaf-07, spine: spine-1}

2. Slurm's ``topology.conf`` (tree plugin): ``ARGUS_SLURM_TOPOLOGY``, else
   ``/etc/slurm/topology.conf`` when it exists. The switch whose ``Nodes=`` holds the host is
   its ``leaf``; the top-most switch above it (through ``Switches=``) is its ``spine``; any
   level between them is not carried.
3. Kubernetes node labels in a file of ``key="value"`` lines (the Downward API's format) at
   ``ARGUS_NODE_LABELS``: ``topology.argus.io/rack|leaf|spine`` as given; else AWS's
   ``topology.k8s.aws/network-node-layer-N`` (the deepest layer present, 3 or 4, is the leaf,
   layer 1 the spine) or GKE's ``cloud.google.com/gce-topology-subblock`` (leaf) and
   ``-block`` (spine). Same rule as Slurm's: nearest level leaf, top-most level spine.

A host is looked up by its name and its short name (before the first dot); Slurm first by
``SLURMD_NODENAME``. A bad file raises ConfigError naming it; :func:`position` logs it and
goes on to the next source.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping

from argus_exporters.config import ConfigError

logger = logging.getLogger("argus_exporters")

KEYS = ("rack", "leaf", "spine")
MAX_FILE_BYTES = 1 << 20  # a map, topology.conf or labels file
MAX_TEXT = 4096
MAX_HOSTLIST = 1 << 17  # names one hostlist expression may expand to (a big cluster: 1e5)
MAX_LEVELS = 64  # switches walked up from a leaf
DEFAULT_SLURM_TOPOLOGY = "/etc/slurm/topology.conf"
AWS_LAYER = "topology.k8s.aws/network-node-layer-"
GKE_BLOCK = "cloud.google.com/gce-topology-block"
GKE_SUBBLOCK = "cloud.google.com/gce-topology-subblock"
ARGUS_LABEL = "topology.argus.io/"

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def read_bounded(path: str, what: str) -> str:
    """``path``'s text (UTF-8), at most MAX_FILE_BYTES; raises ConfigError naming ``what``."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{what}={path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{what}={path}: larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8", "replace")


def host_names(host: str) -> list[str]:
    """The names a host is looked up by: as given, then its short name."""
    short = host.split(".", 1)[0]
    return [host] if short == host or not short else [host, short]


# -- 1. the YAML map ---------------------------------------------------------------------
def _entry(path: str, where: str, entry: object, extra: tuple[str, ...] = ()) -> dict:
    if not isinstance(entry, dict):
        raise ConfigError(f"ARGUS_TOPOLOGY={path}: {where}: expected a mapping of "
                          f"{', '.join(KEYS)}, got {type(entry).__name__}")
    position = {}
    for key, value in entry.items():
        if key in extra:
            continue
        if key not in KEYS:
            raise ConfigError(f"ARGUS_TOPOLOGY={path}: {where}: unknown key {key!r} "
                              f"(expected {', '.join(KEYS)})")
        if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
            raise ConfigError(f"ARGUS_TOPOLOGY={path}: {where}.{key}: expected a string of 1 "
                              f"to {MAX_TEXT} characters, got {value!r} (quote values like "
                              f"\"07\")")
        position[key] = value
    return position


def load_map(path: str) -> tuple[dict[str, dict], list[tuple[str, dict]]]:
    """The map's hosts (name -> position) and patterns ((glob, position), in order);
    raises ConfigError naming the file and what is wrong."""
    import yaml  # the exporters extra has it; imported only when a map is configured

    text = read_bounded(path, "ARGUS_TOPOLOGY")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"ARGUS_TOPOLOGY={path}: not YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict) or set(doc) - {"hosts", "patterns"}:
        raise ConfigError(f"ARGUS_TOPOLOGY={path}: expected a mapping with 'hosts' and/or "
                          f"'patterns', got {doc!r:.200}")
    raw_hosts = doc.get("hosts") or {}
    if not isinstance(raw_hosts, dict):
        raise ConfigError(f"ARGUS_TOPOLOGY={path}: hosts: expected a mapping of host names")
    hosts = {}
    for name, entry in raw_hosts.items():
        if not isinstance(name, str):
            raise ConfigError(f"ARGUS_TOPOLOGY={path}: hosts: host name {name!r} is not a "
                              f"string (quote it)")
        hosts[name] = _entry(path, f"hosts.{name}", entry)
    raw_patterns = doc.get("patterns") or []
    if not isinstance(raw_patterns, list):
        raise ConfigError(f"ARGUS_TOPOLOGY={path}: patterns: expected a list")
    patterns = []
    for i, entry in enumerate(raw_patterns):
        glob = entry.get("match") if isinstance(entry, dict) else None
        if not isinstance(glob, str) or not glob:
            raise ConfigError(f"ARGUS_TOPOLOGY={path}: patterns[{i}]: expected a mapping with "
                              f"a 'match' glob")
        patterns.append((glob, _entry(path, f"patterns[{i}]", entry, ("match",))))
    return hosts, patterns


def from_map(path: str, names: list[str]) -> dict:
    """The position the map at ``path`` gives the first of ``names`` it knows ({} if none)."""
    hosts, patterns = load_map(path)
    for name in names:
        if name in hosts:
            return hosts[name]
    for glob, position in patterns:
        if any(fnmatch.fnmatchcase(name, glob) for name in names):
            return position
    return {}


# -- 2. Slurm's topology.conf ------------------------------------------------------------
def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _bracket(body: str) -> list[str]:
    """``064-067,070`` -> the numbers, each as wide as its range's first bound."""
    values = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"bad range {part!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {part!r} runs backwards")
        if int(high) - int(low) >= MAX_HOSTLIST:
            raise ValueError(f"range {part!r} is too long")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def iter_hostlist(text: str) -> Iterator[str]:
    """Expand a Slurm hostlist: ``h[064-067],h070``, ``r[1-2]n[01-02]`` (every bracket group
    of a name multiplies), zero padding kept. Raises ValueError beyond MAX_HOSTLIST names."""
    count = 0
    for item in _split_top(text):
        pieces = re.split(r"(\[[^\]]*\])", item)
        if any(("[" in p or "]" in p) and not (p.startswith("[") and p.endswith("]"))
               for p in pieces):
            raise ValueError(f"unbalanced brackets in {item!r}")
        choices = [_bracket(p[1:-1]) if p.startswith("[") else [p] for p in pieces]
        for combo in itertools.product(*choices):
            count += 1
            if count > MAX_HOSTLIST:
                raise ValueError(f"{text[:100]!r} expands to more than {MAX_HOSTLIST} names")
            yield "".join(combo)


def expand_hostlist(text: str) -> list[str]:
    """:func:`iter_hostlist` as a list."""
    return list(iter_hostlist(text))


def parse_slurm_topology(text: str) -> list[tuple[str, str, str]]:
    """Each ``SwitchName=`` line's (name, Nodes hostlist, Switches hostlist), in order;
    keys are case-insensitive, ``#`` starts a comment."""
    switches = []
    for line in text.splitlines():
        fields = {}
        for token in line.split("#", 1)[0].split():
            key, _, value = token.partition("=")
            fields[key.lower()] = value
        if fields.get("switchname"):
            switches.append((fields["switchname"], fields.get("nodes", ""),
                             fields.get("switches", "")))
    return switches


def from_slurm(path: str, names: list[str]) -> dict:
    """``leaf`` (the switch holding the first of ``names`` found) and ``spine`` (the
    top-most switch above it) from the topology.conf at ``path``; {} if not found."""
    try:
        switches = parse_slurm_topology(read_bounded(path, "ARGUS_SLURM_TOPOLOGY"))
        wanted = set(names)
        leaf = next((name for name, nodes, _ in switches
                     if nodes and wanted.intersection(iter_hostlist(nodes))), None)
        if leaf is None:
            return {}
        parent = {}
        for name, _, children in switches:
            for child in iter_hostlist(children) if children else ():
                parent.setdefault(child, name)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"ARGUS_SLURM_TOPOLOGY={path}: {exc}") from None
    top, seen = leaf, {leaf}
    while top in parent and parent[top] not in seen and len(seen) < MAX_LEVELS:
        top = parent[top]
        seen.add(top)
    return {"leaf": leaf, "spine": top} if top != leaf else {"leaf": leaf}


# -- 3. Kubernetes node labels -----------------------------------------------------------
def parse_labels(text: str) -> dict[str, str]:
    """``key="value"`` lines (the Downward API's format; values Go-quoted) as a dict."""
    labels = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or not key:
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        labels[key.strip()] = value
    return labels


def from_labels(labels: Mapping[str, str]) -> dict:
    """Rack, leaf and spine from well-known node labels (module docstring)."""
    position = {key: labels[ARGUS_LABEL + key] for key in KEYS if labels.get(ARGUS_LABEL + key)}
    layers = sorted((int(k[len(AWS_LAYER):]), v) for k, v in labels.items()
                    if k.startswith(AWS_LAYER) and k[len(AWS_LAYER):].isdecimal() and v)
    levels = [v for _, v in layers]  # top-most first
    if not levels:
        levels = [labels[k] for k in (GKE_BLOCK, GKE_SUBBLOCK) if labels.get(k)]
    if levels:
        position.setdefault("leaf", levels[-1])
        if len(levels) > 1:
            position.setdefault("spine", levels[0])
    return position


# -- all three ---------------------------------------------------------------------------
def position(host: str, env: Mapping[str, str],
             slurm_default: str | None = DEFAULT_SLURM_TOPOLOGY) -> dict:
    """This host's rack/leaf/spine from the first source that places it ({} if none does).
    A bad file is logged (naming it) and skipped; nothing raises."""
    names = host_names(host)
    slurm = env.get("ARGUS_SLURM_TOPOLOGY") or (
        slurm_default if slurm_default and os.path.isfile(slurm_default) else None)
    node = env.get("SLURMD_NODENAME")
    sources = [
        ("ARGUS_TOPOLOGY", env.get("ARGUS_TOPOLOGY"), lambda p: from_map(p, names)),
        ("ARGUS_SLURM_TOPOLOGY", slurm,
         lambda p: from_slurm(p, ([node] if node else []) + names)),
        ("ARGUS_NODE_LABELS", env.get("ARGUS_NODE_LABELS"),
         lambda p: from_labels(parse_labels(read_bounded(p, "ARGUS_NODE_LABELS")))),
    ]
    for name, path, read in sources:
        if not path:
            continue
        try:
            found = read(path)
        except ConfigError as exc:
            logger.warning("argus: placement: %s", exc)
            continue
        except Exception as exc:  # never into training
            logger.warning("argus: placement: %s=%s: %s", name, path, exc)
            continue
        found = {k: v for k, v in found.items() if isinstance(v, str) and 0 < len(v) <= MAX_TEXT}
        if found:
            return found
    return {}
