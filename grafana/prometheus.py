"""A throwaway local Prometheus holding a backfilled history (Debian's ``prometheus``).

``promtool tsdb create-blocks-from openmetrics`` turns a history into TSDB blocks; Prometheus
starts on a free loopback port over them. Recording rules can then be backfilled with
``promtool tsdb create-blocks-from rules``, one dependency level at a time (promtool cannot
see the output of a rule it is backfilling in the same run), restarting Prometheus between
levels so each level's blocks are queryable by the next. Queries go through the HTTP API.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from argus_core.stack.processes import StackError, free_port, start_child, stop_child

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"


class PrometheusError(RuntimeError):
    """Prometheus or promtool failed; the message carries their output."""


def available() -> str | None:
    """None when the binaries are installed, else what is missing and how to get it."""
    missing = [b for b in (PROMETHEUS, PROMTOOL) if shutil.which(b) is None]
    return None if not missing else (f"{' and '.join(missing)} not found "
                                     "(apt-get install prometheus)")


class LocalPrometheus:
    """Prometheus over ``workdir/data``, started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        self.data = self.workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.port}"

    # -- data -------------------------------------------------------------------------------
    def backfill(self, openmetrics: Iterable[str]) -> None:
        """Write an OpenMetrics history and turn it into blocks in the data directory."""
        source = self.workdir / "history.om"
        with open(source, "w", encoding="utf-8") as out:
            for chunk in openmetrics:
                out.write(chunk)
        _run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source),
              str(self.data)], "backfill")
        source.unlink()

    def backfill_rules(self, rule_files: list[Path], start_s: float, end_s: float,
                       eval_interval: str = "15s") -> list[str]:
        """Backfill every recording rule of ``rule_files`` over [start_s, end_s].

        Rules are split by dependency level (a rule reading another rule's output comes one
        level later); each level is evaluated by promtool against this Prometheus, its blocks
        moved into the data directory, and Prometheus restarted. Returns the recorded names.
        """
        levels = rule_levels(rule_files)
        for depth, rules in enumerate(levels):
            level_file = self.workdir / f"rules-level-{depth}.yml"
            level_file.write_text(json.dumps({"groups": [{"name": f"level-{depth}",
                                                          "rules": rules}]}))
            out = self.workdir / f"rules-blocks-{depth}"
            _run([PROMTOOL, "tsdb", "create-blocks-from", "rules", f"--url={self.url}",
                  f"--start={int(start_s)}", f"--end={int(end_s)}",
                  f"--eval-interval={eval_interval}", f"--output-dir={out}", str(level_file)],
                 f"rules level {depth}")
            for block in out.iterdir():
                if block.is_dir():
                    block.rename(self.data / block.name)
            self.restart()
        return sorted({rule["record"] for rules in levels for rule in rules})

    # -- process ----------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        """Start Prometheus on a free port and wait until it is ready."""
        config = self.workdir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n")
        self.port = free_port()
        try:
            self.proc = start_child(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.data}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=30d"],
                self.url + "/-/ready", self.workdir / "prometheus.log", timeout)
        except StackError as exc:
            raise PrometheusError(str(exc)) from None

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then SIGKILL after 20 s)."""
        stop_child(self.proc)
        self.proc = None

    def restart(self) -> None:
        """Stop and start again (a new port): Prometheus loads blocks added meanwhile."""
        self.stop()
        self.start()

    def __enter__(self) -> LocalPrometheus:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise PrometheusError(f"promtool {what} failed ({result.returncode}): "
                              f"{(result.stdout + result.stderr)[-2000:]}")


# -- recording rules by dependency level -------------------------------------------------------
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def rule_levels(rule_files: list[Path]) -> list[list[dict]]:
    """The recording rules of ``rule_files`` grouped by dependency level (alerts are left out:
    Prometheus writes ALERTS only while it evaluates them live)."""
    import yaml

    rules = [rule for path in rule_files
             for group in (yaml.safe_load(path.read_text()) or {}).get("groups", ())
             for rule in group.get("rules", ()) if "record" in rule]
    recorded = {rule["record"] for rule in rules}
    depth: dict[int, int] = {}

    def level(index: int, seen: frozenset = frozenset()) -> int:
        if index in depth:
            return depth[index]
        if index in seen:
            raise PrometheusError(f"recording rules form a cycle at {rules[index]['record']}")
        # a rule reading its own previous output (a remembered value) is not its own parent:
        # backfilled, that branch is simply empty
        reads = (set(_NAME.findall(_without_strings(rules[index]["expr"]))) & recorded
                 - {rules[index]["record"]})
        parents = [i for i, rule in enumerate(rules) if rule["record"] in reads]
        depth[index] = 1 + max((level(i, seen | {index}) for i in parents), default=-1)
        return depth[index]

    for index in range(len(rules)):
        level(index)
    return [[rules[i] for i in range(len(rules)) if depth[i] == d]
            for d in range(max(depth.values(), default=-1) + 1)]


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', '""', expr)


# -- HTTP API ----------------------------------------------------------------------------------
def api(base_url: str, path: str, params: dict[str, str], timeout: float = 60.0) -> object:
    """GET a Prometheus API endpoint and return its ``data``; PrometheusError on an error."""
    url = f"{base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
        raise PrometheusError(f"{path}: {body.get('errorType', exc.code)}: "
                              f"{body.get('error', exc.reason)}") from None
    except OSError as exc:
        raise PrometheusError(f"cannot reach Prometheus at {base_url}: {exc}") from None
    if body.get("status") != "success":
        raise PrometheusError(f"{path}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]
