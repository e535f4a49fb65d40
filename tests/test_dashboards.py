"""The generated Grafana dashboards: committed JSON equals the generator's, the SDK's model round
trip, Grafana 11.6's schema (as the SDK models it), and the promises every panel keeps."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from argus_core.cli import main
from argus_core.rules.config import RulesConfig
from argus_grafana import generate, queries, schema

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "grafana"


@pytest.fixture(scope="module")
def written() -> dict[str, str]:
    return generate.render_all()


@pytest.fixture(scope="module")
def boards(written) -> dict[str, dict]:
    return {path: json.loads(text) for path, text in written.items() if path.endswith(".json")}


def test_committed_files_equal_what_the_generator_writes(written):
    for relative, text in written.items():
        path = COMMITTED / relative
        assert path.exists(), f"{path} missing: run `argus dashboards --out grafana`"
        assert path.read_text("utf-8") == text, (
            f"{path} differs from the generator's output: run `argus dashboards --out grafana`")
    committed = {p.relative_to(COMMITTED).as_posix()
                 for p in (COMMITTED / "dashboards").glob("*.json")}
    assert committed == {p for p in written if p.startswith("dashboards/")}, "stale JSON files"


def test_cli_writes_the_same_files(tmp_path, written, capsys):
    assert main(["dashboards", "--out", str(tmp_path)]) == 0
    listed = capsys.readouterr().out.split()
    assert len(listed) == len(written)
    for relative, text in written.items():
        assert (tmp_path / relative).read_text("utf-8") == text


def test_cli_provider_path_goes_into_the_provisioning_file(tmp_path):
    assert main(["dashboards", "--out", str(tmp_path), "--provider-path", "/srv/g d"]) == 0
    text = (tmp_path / generate.PROVISIONING_FILE).read_text()
    assert 'path: "/srv/g d"' in text and "type: file" in text


def test_cli_needs_out_or_check(capsys):
    assert main(["dashboards"]) == 2
    assert "--out DIR or --check URL" in capsys.readouterr().err


def test_five_dashboards_with_stable_uids_tags_time_refresh(boards):
    uids = {board["uid"] for board in boards.values()}
    assert uids == {"argus-overview", "argus-stragglers", "argus-kernels", "argus-pipeline",
                    "argus-suspects"}
    for board in boards.values():
        assert "argus" in board["tags"]
        assert board["time"] == {"from": "now-1h", "to": "now"}
        assert board["refresh"] == "30s"


def test_generation_is_deterministic():
    assert generate.render_all() == generate.render_all()


@pytest.mark.parametrize("uid", list(generate.BUILDERS))
def test_sdk_model_round_trip_is_lossless(boards, uid):
    board = boards[f"dashboards/{uid}.json"]
    assert schema.round_trip(board) == board


@pytest.mark.parametrize("uid", list(generate.BUILDERS))
def test_grafana_11_6_accepts_every_panel_field_and_datasource(boards, uid):
    assert schema.problems(boards[f"dashboards/{uid}.json"]) == []


def test_variables_each_dashboard_declares(boards):
    names = {board["uid"]: [v["name"] for v in board["templating"]["list"]]
             for board in boards.values()}
    assert names["argus-overview"] == ["datasource", "job"]
    assert names["argus-stragglers"] == ["datasource", "job", "axis", "rank"]
    assert names["argus-kernels"] == ["datasource", "job", "rank", "kernel", "traces",
                                      "argus_read_token"]
    assert names["argus-pipeline"] == ["datasource", "job"]
    assert names["argus-suspects"] == ["datasource", "job"]
    axis = next(v for v in boards["dashboards/argus-stragglers.json"]["templating"]["list"]
                if v["name"] == "axis")
    # the axes whose groups the L2 rules record (pipeline stages are the scorer's to compare)
    assert [o["value"] for o in axis["options"]] == list(RulesConfig().axes)


def test_every_metric_a_query_reads_is_in_the_names_table(boards):
    """A metric name outside queries.METRICS would dodge the data checks: none may exist."""
    unknown = set()
    for board in boards.values():
        for text, _ in schema._texts(board):
            bare = schema._VARIABLE.sub("", queries._strip_strings(text))
            for token in queries._NAME.findall(bare):
                if token.startswith(("argus_", "job:", "axis_group:")) \
                        and token not in queries.METRICS:
                    unknown.add(token)
    assert unknown == set()


def test_kernels_panels_link_to_perfetto(boards):
    kernels = boards["dashboards/argus-kernels.json"]
    linked = [panel for panel in kernels["panels"]
              if any("/v1/traces/perfetto?" in link["url"]
                     for link in panel["fieldConfig"]["defaults"].get("links", ()))]
    titles = {panel["title"] for panel in linked}
    assert {"W1 score per rank", "$kernel p50 by rank", "$kernel p99 by rank"} <= titles
    for panel in linked:
        urls = [link["url"] for link in panel["fieldConfig"]["defaults"]["links"]]
        assert any(url.startswith("${traces}/v1/traces/open?") for url in urls)
        assert all("rank=${__" in url and "at=${__" in url for url in urls)


# -- the schema check itself must catch what Grafana would reject ------------------------------
def _first_panel(board: dict) -> dict:
    return next(p for p in board["panels"] if p["type"] != "row")


@pytest.mark.parametrize("mutation, message", [
    (lambda b: _first_panel(b).__setitem__("type", "timeserie"), "unknown panel type"),
    (lambda b: _first_panel(b).__setitem__("colour", "red"), "unknown field"),
    (lambda b: _first_panel(b)["options"]["legend"].__setitem__("displayMode", "tabular"),
     "LegendDisplayMode"),
    (lambda b: b.__setitem__("graphTooltip", 7), "DashboardCursorSync"),
    (lambda b: _first_panel(b).__setitem__("datasource", {"type": "prometheus",
                                                          "uid": "prom-1"}), "$datasource"),
    (lambda b: _first_panel(b)["targets"][0].__setitem__("expr", "up{job=\"$jobb\"}"),
     "$jobb"),
    (lambda b: _first_panel(b).pop("description"), "no description"),
    (lambda b: _first_panel(b)["fieldConfig"]["defaults"].pop("unit"), "no unit"),
    (lambda b: _first_panel(b).__setitem__(
        "transformations", [{"id": "organise", "options": {}}]), "unknown transformation"),
    (lambda b: _first_panel(b)["targets"][0]["datasource"].__setitem__("type", "loki"),
     "datasource"),
])
def test_schema_check_rejects(boards, mutation, message):
    board = copy.deepcopy(boards["dashboards/argus-kernels.json"])
    mutation(board)
    found = schema.problems(board)
    assert any(message in problem for problem in found), found


def test_queries_know_where_their_metrics_come_from():
    assert queries.sources(queries.ITERATION_SECONDS) == {queries.EXPORTER}
    assert queries.sources(queries.PHASE_RATIO) == {queries.EXPORTER, queries.RULES}
    assert queries.sources(queries.DEGRADED_KERNELS) == {queries.SCORER}
    # label values are not metric names
    assert queries.metric_names('argus_rank_info{job="argus_steps_total"}') == {
        "argus_rank_info"}
