"""The docs say what the code does: the rules' config reference is generated from the code,
every alert's runbook anchor is a section of docs/runbook.md, links stay inside the repository
and land on a file and heading that exist, and the numbers and defaults the pages quote are
the code's (thresholds, windows, the cost floor, the exporters' and the processor's defaults).
A fact changed in the code fails here until the page says it too."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from pathlib import Path

import pytest
import yaml

from argus_core.cli import build_parser
from argus_core.detect.cost import MIN_COST_SHARE
from argus_core.detect.diagnose import DiagnoseConfig
from argus_core.detect.l3 import L3Config
from argus_core.processor.config import MAX_MEMBERS, ProcessorConfig
from argus_core.processor.links import DEFAULT_EXPIRES_S
from argus_core.rules.alerts import alert_groups
from argus_core.rules.config import (
    RUNBOOK_PATH,
    RulesConfig,
    Selectors,
    override,
    reference_markdown,
)
from argus_exporters.config import Settings

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = sorted([REPO / "README.md", *DOCS.glob("*.md")])
RULES = RulesConfig()
DIAGNOSE = DiagnoseConfig()
PROCESSOR = ProcessorConfig()


def read(name: str) -> str:
    return (REPO / name).read_text()


def prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code (what a renderer turns into links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """The anchor GitHub-style renderers give a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a page (repeated headings get -1, -2, ... as rendered)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def table(page: str, first_header: str) -> dict[str, list[str]]:
    """The markdown table whose header starts with ``first_header``: first cell -> the others."""
    lines = read(page).split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


def names(cell: str) -> list[str]:
    """The code-quoted names of a table's first cell (`--flag N`, `ARGUS_X`, `l2.alpha`)."""
    return [n.split()[0] for n in re.findall(r"`([^`]+)`", cell)]


def human(seconds: float) -> str:
    """A duration as the pages write it: 15 s, 2 m, 6 h."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g} {unit}"
    return f"{seconds:g} s"


def percent(share: float) -> str:
    return f"{share * 100:g}%"


# -- the config reference --------------------------------------------------------------------

def _docs_script():
    spec = importlib.util.spec_from_file_location("argus_docs_script", REPO / "scripts/docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rules_config_reference_is_what_the_code_generates():
    script = _docs_script()
    assert read("docs/rules.md") == script.rendered(), (
        "docs/rules.md's config reference differs from the code: run `python scripts/docs.py`")
    assert script.main(["--check"]) == 0


def test_the_config_reference_lists_every_key_with_its_default():
    rows = table("docs/rules.md", "key")
    keys = [f"selectors.{f.name}" for f in dataclasses.fields(Selectors)] + [
        f.name for f in dataclasses.fields(RulesConfig) if f.name != "selectors"]
    assert [names(k)[0] for k in rows] == keys
    for cell, (default, meaning) in rows.items():
        assert default.startswith("`") and meaning, cell
    # the defaults shown read back as the defaults (durations, lists, strings, numbers)
    data: dict = {"selectors": {}}
    for cell, (default, _) in rows.items():
        key, value = names(cell)[0], yaml.safe_load(default.strip("`"))
        if key.startswith("selectors."):
            data["selectors"][key.split(".", 1)[1]] = value
        else:
            data[key] = value
    assert override(RulesConfig(), data, "docs/rules.md") == RULES
    assert "| `runbook_url` | `'docs/runbook.md'` |" in reference_markdown()


# -- runbook anchors ---------------------------------------------------------------------------

def _configs() -> list[RulesConfig]:
    return [RULES, override(RULES, {"l2_source": "promql"}), RULES.scaled(15)]


def test_every_alerts_runbook_url_is_a_section_of_docs_runbook():
    sections = anchors(REPO / RUNBOOK_PATH)
    urls = {rule["annotations"]["runbook_url"]
            for config in _configs() for group in alert_groups(config) for rule in group["rules"]}
    committed = yaml.safe_load(read("alerting/argus.alerts.yml"))
    urls |= {rule["annotations"]["runbook_url"]
             for group in committed["groups"] for rule in group["rules"]}
    for path in REPO.glob("alerting/tests/*.test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", ()):
                for alert in check["exp_alerts"]:
                    urls.add(alert["exp_annotations"]["runbook_url"])
    assert len(urls) >= 14
    for url in urls:
        page, _, anchor = url.partition("#")
        assert page == RUNBOOK_PATH and (REPO / page).is_file(), url
        assert anchor in sections, f"{url}: docs/runbook.md has no heading for #{anchor}"


# -- links ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_stay_in_the_repository_and_resolve(page):
    text = prose(page.read_text())
    assert not re.search(r"https?://|www\.|github\.com", text, re.I), (
        f"{page.name} points outside the repository")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        assert resolved.is_relative_to(REPO), f"{page.name}: {target} leaves the repository"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: {target}: no such heading"


def test_the_readme_is_short_and_links_every_page():
    readme = read("README.md")
    assert len(readme.split("\n")) <= 150
    for page in DOCS.glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"the README does not link docs/{page.name}"
    makefile = read("Makefile")
    assert "make demo" in readme and re.search(r"^demo: .*\n\t\$\(BIN\)/argus demo$", makefile,
                                               re.M)
    assert "make test" in readme and "make test" in read(".ci/run")


# -- facts the pages quote ---------------------------------------------------------------------

def fact(page: str, pattern: str) -> tuple[str, ...]:
    """The groups of ``pattern`` in ``page`` (whitespace in the pattern matches line breaks)."""
    regex = re.sub(r"(\\ )+", r"\\s+", re.escape(pattern))
    regex = regex.replace(re.escape("{}"), r"([\w.,:/%-]+?)")
    match = re.search(regex, read(page))
    assert match, f"{page} no longer says: {pattern}"
    return match.groups()


RUNBOOK_FACTS = [
    # (pattern with {} for each quoted value, the code's values as the page writes them)
    ("took `spike_ratio` ({}x) or more of the rolling median", [f"{RULES.spike_ratio:g}"]),
    ("the median over `spike_history`, {} minutes", [f"{RULES.spike_history / 60:g}"]),
    ("The median iteration time of the last {} minutes is {}x or more",
     [f"{RULES.regression_recent / 60:g}", f"{RULES.min_regression:g}"]),
    ("the lowest {}-minute median in the {} hours before (`regression_baseline`)",
     [f"{RULES.regression_recent / 60:g}", f"{RULES.regression_baseline / 3600:g}"]),
    ("or {} hours on, when the slower pace", [f"{RULES.regression_baseline / 3600:g}"]),
    ("over the last {} minutes (than the job's median rank",
     [f"{RULES.host_window / 60:g}"]),
    ("plus {} of the window (`min_cost_share`", [percent(RULES.min_cost_share)]),
    ("over the median of its last {} steps: by {}x or more",
     [str(RULES.exporter_window_steps), f"{RULES.l2_min_ratio:g}"]),
    ("threshold (at least {}, higher in larger jobs", [f"{RULES.l2_z:g}"]),
    ("is at least {} (the core's `l3.min_score`)", [percent(L3Config().min_score)]),
    ("within the last {} (`silent_window`)", ["hour" if RULES.silent_window == 3600 else "?"]),
    ("More than {} of the records a processor receives are rejected",
     [percent(RULES.processor_reject_ratio)]),
    ("For {} minutes, a processor accepted and then dropped more than {} (`processor_late_ratio`)",
     [f"{RULES.for_pipeline / 60:g}", percent(RULES.processor_late_ratio)]),
    ("`--grace`, {} s, or after", [f"{PROCESSOR.grace_s:g}"]),
    ("has not completed a round for {} minutes", [f"{RULES.scorer_stale_after / 60:g}"]),
]


@pytest.mark.parametrize(("pattern", "expected"), RUNBOOK_FACTS, ids=lambda v: str(v)[:40])
def test_the_runbook_quotes_the_rules_thresholds(pattern, expected):
    assert list(fact("docs/runbook.md", pattern)) == expected


def test_the_runbook_has_no_stale_kernel_threshold():
    section = read("docs/runbook.md").split("## ArgusKernelStraggler")[1].split("\n## ")[0]
    assert "15%" not in section


def test_the_production_defaults_table_is_the_rules_config():
    rows = {k: v[0] for k, v in table("docs/rules.md", "setting").items()}
    r = RULES
    assert rows["scrape and evaluation interval"] == human(r.scrape_interval) == human(
        r.evaluation_interval)
    assert rows["`slow_interval`"] == human(r.slow_interval)
    assert rows["`rate_window`, `host_window`"] == human(r.rate_window) == human(r.host_window)
    assert rows["`regression_recent` / `regression_baseline`"] == (
        f"{human(r.regression_recent)} / {human(r.regression_baseline)}")
    assert rows["`for`: spike, host stall"] == f"{human(r.for_spike)}, {human(r.for_host)}"
    assert rows["`for`: straggler rank and link, kernel straggler"] == (
        f"{human(r.for_straggler)}, {human(r.for_kernel)}")
    assert rows["`for`: regression"] == human(r.for_regression)
    assert rows["`for`: exporter down, processor down and scorer stale, other pipeline"] == (
        f"{human(r.for_exporter_down)}, {human(r.for_component_down)}, "
        f"{human(r.for_pipeline)}")
    assert rows["Alertmanager `group_wait` / `group_interval` / `repeat_interval`"] == (
        f"{human(r.group_wait)} / {human(r.group_interval)} / {human(r.repeat_interval)}")


def test_the_diagnosis_thresholds_table_is_the_cores():
    rows = table("docs/diagnosis.md", "setting")
    assert len(rows) >= 15
    for cell, (defaults, _) in rows.items():
        keys = names(cell)
        values = [v.strip() for v in defaults.split(",")]
        assert len(keys) == len(values), cell
        for key, shown in zip(keys, values, strict=True):
            target = DIAGNOSE
            for part in key.split("."):
                target = getattr(target, part)
            if isinstance(target, bool):
                assert shown == str(target).lower(), key
            elif isinstance(target, str):
                assert shown == target, key
            else:
                assert math.isclose(float(shown), target), key


def test_the_quoted_floors_and_windows_are_the_codes():
    sweep = pytest.importorskip("test_healthy_sweep")
    runs = sum(seeds for _, seeds in sweep.SWEEP)
    (jobs,) = fact("docs/diagnosis.md", "of {} healthy simulated jobs from 2 to 1,024 ranks")
    assert int(jobs) == runs
    (tolerated,) = fact("docs/diagnosis.md", "all but at most {}) get no verdict")
    assert int(tolerated) == math.floor(0.01 * runs)
    assert fact("docs/diagnosis.md", "(`verdict.min_cost_share`, {} of a step)") == (
        percent(MIN_COST_SHARE),)
    assert DIAGNOSE.verdict.min_cost_share == MIN_COST_SHARE == RULES.min_cost_share
    assert fact("docs/diagnosis.md", "`--window SECONDS` (kernel compression window, {})") == (
        f"{DIAGNOSE.window_s:g}",)
    steps = Settings().window_steps
    assert steps == RULES.exporter_window_steps
    assert fact("docs/rules.md", "The rolling windows hold `ARGUS_WINDOW_STEPS` ({}) steps") == (
        str(steps),)
    assert fact("docs/deploying.md", "to `ARGUS_HTTP_RETRY_S` ({} s) per batch") == (
        f"{Settings().http_retry_s:g}",)
    assert fact("docs/processor.md", "any number of members up to {})") == (f"{MAX_MEMBERS:,}",)
    assert fact("docs/dashboards.md", "`ARGUS_TRACE_LINK_EXPIRES_S` seconds (default {})") == (
        str(DEFAULT_EXPIRES_S),)
    score = _parser("score")
    assert fact("docs/rules.md", "Each `--interval` ({} s, the processors' window)") == (
        f"{score['--interval'].default:g}",)
    assert fact("docs/rules.md", "`--timeout` ({} s) is the deadline") == (
        f"{score['--timeout'].default:g}",)
    assert fact("docs/rules.md", "`--max-answer-mb` ({}) is the longest answer") == (
        f"{score['--max-answer-mb'].default:g}",)


def _parser(command: str) -> dict:
    """Option string -> argparse action of one ``argus`` command."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return {o: a for a in sub.choices[command]._actions for o in a.option_strings}


_SIZE = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _shown(value: str, default):
    """A table's default cell as the code's value (`0`/`1` flags, sizes in MiB, `auto`, unset)."""
    value = value.strip().strip("`")
    if isinstance(default, bool):
        return value == "1"
    if value == "unset":
        return None
    number, _, unit = value.partition(" ")
    if unit in _SIZE:
        return int(float(number) * _SIZE[unit])
    if isinstance(default, (int, float)) and value != "auto":
        return type(default)(float(number))
    return value


# variable -> Settings field (variables the exporters read elsewhere are documented-only)
EXPORTER_FIELDS = {
    "ARGUS_ENABLED": "enabled", "ARGUS_SINK": "sink", "ARGUS_PHASES": "phases",
    "ARGUS_KERNELS": "kernels", "ARGUS_STACKS": "stacks", "ARGUS_COLLECTIVES": "collectives",
    "ARGUS_NATIVE_HOOKS": "native_hooks",
    "ARGUS_METRICS_PORT": "metrics_port", "ARGUS_METRICS_ADDR": "metrics_addr",
    "ARGUS_WINDOW_STEPS": "window_steps", "ARGUS_KERNEL_DUTY": "kernel_duty",
    "ARGUS_KERNEL_BUDGET": "kernel_budget", "ARGUS_KERNEL_BUFFERS": "kernel_buffers",
    "ARGUS_KERNEL_BUFFER_BYTES": "kernel_buffer_bytes", "ARGUS_KERNEL_FLUSH_S": "kernel_flush_s",
    "ARGUS_KERNEL_CALLBACKS": "kernel_callbacks", "ARGUS_STACK_PERIOD_S": "stack_period_s",
    "ARGUS_STACK_SPIKE_RATIO": "stack_spike_ratio", "ARGUS_QUEUE_RECORDS": "queue_records",
    "ARGUS_BATCH_RECORDS": "batch_records", "ARGUS_FLUSH_S": "flush_s",
    "ARGUS_PENDING_STEPS": "pending_steps", "ARGUS_HTTP_TIMEOUT_S": "http_timeout_s",
    "ARGUS_HTTP_RETRY_S": "http_retry_s", "ARGUS_FILE_MAX_BYTES": "file_max_bytes",
    "ARGUS_SPOOL_MAX_BYTES": "spool_max_bytes", "ARGUS_OTEL": "otel",
}


def test_the_exporters_variables_table_is_exporters_config():
    """Every ARGUS_* variable exporters/config.py reads is in docs/exporters.md's table, with
    the default ``Settings.from_env({})`` takes."""
    rows = table("docs/exporters.md", "variable")
    documented = {}
    for cell, (defaults, _) in rows.items():
        variables = names(cell)
        values = [v.strip() for v in re.split(r",\s+(?![^(]*\))", defaults)]
        if len(values) != len(variables):
            values = [defaults] * len(variables)
        documented.update(zip(variables, values, strict=True))
    read_in_config = set(re.findall(r'"(ARGUS_[A-Z_]+)"',
                                    (REPO / "exporters/config.py").read_text()))
    assert read_in_config <= set(documented), read_in_config - set(documented)
    defaults = Settings.from_env({})
    assert set(EXPORTER_FIELDS) <= read_in_config
    for variable, field in EXPORTER_FIELDS.items():
        code = getattr(defaults, field)
        shown = documented[variable]
        if variable == "ARGUS_KERNEL_DUTY":
            assert (shown, code) == ("`auto`", 0)
        else:
            assert _shown(shown, code) == code, f"{variable}: the page says {shown}, code {code}"


# option -> (ProcessorConfig field, how the option writes it)
PROCESSOR_FIELDS = {
    "--window": ("window_s", 1), "--grace": ("grace_s", 1),
    "--max-body-mb": ("max_body_bytes", 1 << 20), "--max-skew": ("max_skew_s", 1),
    "--max-age": ("max_age_s", 1), "--memory-budget-mb": ("memory_budget_bytes", 1 << 20),
    "--durability": ("durability", None), "--wal-sync-interval": ("wal_sync_interval_s", 1),
    "--wal-max-mb": ("wal_max_bytes", 1 << 20), "--spool-max-mb": ("max_spool_bytes", 1 << 20),
    "--chunk-events": ("chunk_events", 1), "--state-ttl": ("state_ttl_s", 1),
    "--max-ranks": ("max_ranks", 1), "--max-connections": ("max_connections", 1),
    "--read-timeout": ("read_timeout_s", 1), "--idle-timeout": ("idle_timeout_s", 1),
    "--top-k": ("top_k", 1), "--max-windows-per-rank": ("max_windows_per_rank", 1),
    "--max-body-windows": ("max_body_windows", 1),
    "--max-metrics-series": ("max_metrics_series", 1),
    "--store": ("store", None), "--spool": ("spool_dir", None),
}


def test_the_processor_settings_table_is_processor_config():
    """Every ``argus processor`` option is in docs/processor.md's table; each bound's default
    is ProcessorConfig's (and the option's own default agrees)."""
    rows = table("docs/processor.md", "setting")
    documented = {name: values[0] for cell, values in rows.items() for name in names(cell)}
    options = _parser("processor")
    assert {o for o in options if o.startswith("--") and o != "--help"} <= set(documented)
    assert documented["--listen"] == f"`{PROCESSOR.host}:{PROCESSOR.port}`"
    assert options["--listen"].default == f"{PROCESSOR.host}:{PROCESSOR.port}"
    for option, (field, scale) in PROCESSOR_FIELDS.items():
        code = getattr(PROCESSOR, field)
        shown = documented[option]
        if scale is None:
            assert shown == f"`{code}`", option
            continue
        assert math.isclose(float(shown), code / scale), f"{option}: page {shown}, code {code}"
        cli_default = options[option].default
        if cli_default is not None:  # --spool-max-mb: None means ProcessorConfig's
            assert math.isclose(cli_default, code / scale), option
