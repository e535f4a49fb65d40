"""The metrics engine of the local stack: what scrapes, stores, evaluates the rules and notifies
Alertmanager, on either of two engines that run the same generated rule files.

- ``prometheus``: one Prometheus does it all (``prometheus.yml`` with the rule files).
- ``victoriametrics``: ``victoria-metrics`` stores the series and answers the Prometheus query
  API (the scorer, Grafana and ``argus stack status``'s ``prometheus`` URL point at it); two
  ``vmagent`` instances split the scrape targets between them
  (``-promscrape.cluster.membersCount/memberNum``: each target is scraped by exactly one) and
  remote-write to it; ``vmalert`` evaluates the rule files against it, writes the recording
  rules' results and its alert state back to it, and notifies Alertmanager.

Every interval a production deployment leaves at its default is set here from the rules' own
intervals: victoria-metrics hides the newest 30 s of samples from queries by default
(``-search.latencyOffset``), vmagent rereads file_sd files every 5 minutes and vmalert flushes
what it records every 5 s; at the stack's time scale those would hold an alert back by whole
scaled hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from argus_core.rules.config import RulesConfig, format_duration

PROMETHEUS = "prometheus"
VICTORIAMETRICS = "victoriametrics"
ENGINES = (PROMETHEUS, VICTORIAMETRICS)
MAX_QUERY_SERIES = 10_000_000  # series one query may select on victoria-metrics
VMAGENTS = 2  # scrapers sharing the targets on the VictoriaMetrics engine
# How long a scraped sample takes to reach an export, beyond the scrape interval: vmagent's
# remote-write flush (1 s), the store's flush to searchable parts (1 s) and a loaded machine's
# delay. Measured here at a 1 s scrape: the newest sample 0.8-2.8 s old, idle or loaded.
DELIVERY_S = 5.0

# The Debian package that provides each program the engines run.
PACKAGES = {"prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager",
            "victoria-metrics": "victoria-metrics", "vmagent": "victoria-metrics",
            "vmalert": "victoria-metrics"}


@dataclass(frozen=True)
class Component:
    """One process of the engine: its command and the URL that answers 2xx once it is up."""

    name: str
    argv: list[str]
    ready: str


def components(engine: str) -> tuple[str, ...]:
    """The engine's processes, in start order; the first one answers the query API."""
    if engine == PROMETHEUS:
        return ("prometheus",)
    if engine == VICTORIAMETRICS:
        return ("victoria-metrics", *(f"vmagent-{i}" for i in range(VMAGENTS)), "vmalert")
    raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")


def programs(engine: str) -> tuple[str, ...]:
    """The programs the engine needs installed."""
    return ("prometheus",) if engine == PROMETHEUS else ("victoria-metrics", "vmagent",
                                                         "vmalert")


def own_scrape_targets(engine: str, addr: dict[str, str]) -> dict[str, list[str]]:
    """Scrape job name -> host:port of the engine's own components (their /metrics), so the
    engine's health and rule evaluation times are series like any other."""
    if engine == PROMETHEUS:
        return {"prometheus": [addr["prometheus"]]}
    return {"victoria-metrics": [addr["victoria-metrics"]],
            "vmagent": [addr[f"vmagent-{i}"] for i in range(VMAGENTS)],
            "vmalert": [addr["vmalert"]]}


def scorer_flags(engine: str, rules: RulesConfig) -> list[str]:
    """``argus score``'s flags for the engine: on victoria-metrics the kernel summaries and
    phase windows are exported (streamed: a third of the query's fetch time at 10,000 ranks x
    100 kernels), each series' last sample within two scrape intervals and the delivery's
    delay (``DELIVERY_S``): a shorter lookback misses every series of a rank scraped late."""
    if engine == PROMETHEUS:
        return []
    return ["--read", "export", "--lookback", f"{2 * rules.scrape_interval + DELIVERY_S:g}"]


def commands(engine: str, binary, rules: RulesConfig, workdir: Path, addr: dict[str, str],
             files: dict[str, Path], alertmanager: str) -> list[Component]:
    """The engine's processes with their arguments (``binary(name)`` finds a program;
    ``addr`` maps component names to host:port; ``files`` are ``write_configs``'s)."""
    def url(name: str) -> str:
        return f"http://{addr[name]}"

    if engine == PROMETHEUS:
        return [Component("prometheus", [
            binary("prometheus"), f"--config.file={files['scrape']}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address={addr['prometheus']}", "--web.enable-lifecycle"],
            url("prometheus") + "/-/ready")]
    scrape = format_duration(rules.scrape_interval)
    evaluation = format_duration(rules.evaluation_interval)
    store = url("victoria-metrics")
    out = [Component("victoria-metrics", [
        binary("victoria-metrics"), f"-httpListenAddr={addr['victoria-metrics']}",
        f"-storageDataPath={workdir / 'victoria-metrics-data'}", "-retentionPeriod=1d",
        # samples are queryable one scrape after they arrive, not 30 s
        f"-search.latencyOffset={scrape}",
        # the scorer reads a peer set's kernel summaries in one query: 800,000 series at
        # 2,000 ranks x 100 kernels, over the default cap of 300,000 (HTTP 422)
        f"-search.maxUniqueTimeseries={MAX_QUERY_SERIES}"], store + "/health")]
    for i in range(VMAGENTS):
        name = f"vmagent-{i}"
        out.append(Component(name, [
            binary("vmagent"), f"-httpListenAddr={addr[name]}",
            f"-promscrape.config={files['scrape']}",
            f"-promscrape.cluster.membersCount={VMAGENTS}", f"-promscrape.cluster.memberNum={i}",
            f"-promscrape.fileSDCheckInterval={scrape}",
            f"-remoteWrite.url={store}/api/v1/write",
            f"-remoteWrite.tmpDataPath={workdir / (name + '-data')}"], url(name) + "/health"))
    out.append(Component("vmalert", [
        binary("vmalert"), f"-httpListenAddr={addr['vmalert']}",
        f"-rule={files['recording']}", f"-rule={files['alerting']}",
        f"-datasource.url={store}", f"-remoteWrite.url={store}", f"-remoteRead.url={store}",
        f"-remoteWrite.flushInterval={evaluation}", f"-evaluationInterval={evaluation}",
        f"-notifier.url=http://{alertmanager}"], url("vmalert") + "/health"))
    return out
