"""``argus stack up|status|down``: a metrics engine (Prometheus, or VictoriaMetrics with two
vmagents and vmalert: ``argus_core.stack.engines``), Alertmanager, the processor, the scorer,
an S3 server and optionally live simulated jobs, on one machine, in one working directory.

Everything is a plain process started here with its own config, data directory and free
loopback port (``DIR/stack.json`` records what was started; ``DIR/logs/`` holds each one's
output). The engines and Alertmanager are Debian's binaries (``prometheus``,
``victoria-metrics``, ``vmagent``, ``vmalert``, ``prometheus-alertmanager``); the S3 server is
moto's (``moto_server``). The whole stack runs
``time_scale`` times faster than production (scrape and evaluation intervals, rule windows
and ``for`` durations, the processor's window, the scorer's interval), 15x by default, so a
fault is visible in Alertmanager within a minute rather than ten.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from argus_core.rules.config import L2_SCORER, RulesConfig, format_duration, load_config
from argus_core.stack import engines
from argus_core.stack.configs import write_configs
from argus_core.stack.processes import Process, StackError, free_port, start, wait_ready

STATE_FILE = "stack.json"
NOMINAL_STEP_S = 4.0  # a healthy training step in production, as the rules' defaults assume
LIVE_FAULT_DELAY_STEPS = 40  # live faults start this much later: a healthy baseline first
BUCKET = "argus-traces"
COMPONENTS = ("s3", "processor", "webhook", "alertmanager", "scorer", "act")  # then the engine's


@dataclass(frozen=True)
class StackConfig:
    """What ``argus stack up`` starts."""

    workdir: Path
    simulate: tuple[str, ...] = ()  # cases to run as live jobs
    ranks: int | None = None  # world size of the live jobs (dp scaled to it)
    time_scale: float = 15.0
    rules_config: str | None = None  # the user's rule overrides
    host: str = "127.0.0.1"
    engine: str = engines.PROMETHEUS  # one of engines.ENGINES

    @property
    def rules(self) -> RulesConfig:
        """The rules the stack runs: the user's config, ``time_scale`` times faster."""
        return load_config(self.rules_config).scaled(self.time_scale)


def binary(name: str) -> str:
    """Path of a required program, or a StackError saying how to install it. Python tools
    (moto_server) come from beside the running interpreter first, as pip installed them."""
    beside = Path(sys.executable).parent / name
    if name == "moto_server" and beside.exists():
        return str(beside)
    path = shutil.which(name)
    if path is None:
        hint = ("pip install 'moto[server]'" if name == "moto_server" else
                f"apt-get install {engines.PACKAGES.get(name, name)}")
        raise StackError(f"{name} is not installed ({hint})")
    return path


@dataclass
class Stack:
    """A started stack: its processes and URLs, saved in ``workdir/stack.json``."""

    workdir: Path
    urls: dict[str, str] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    # -- state --------------------------------------------------------------------------------
    @classmethod
    def load(cls, workdir: str | Path) -> Stack:
        """The stack recorded in ``workdir``; StackError if there is none."""
        workdir = Path(workdir)
        path = workdir / STATE_FILE
        if not path.exists():
            raise StackError(f"no stack in {workdir} (no {STATE_FILE}); run `argus stack up`")
        data = json.loads(path.read_text())
        return cls(workdir, data["urls"], [Process.from_dict(p) for p in data["processes"]],
                   data.get("info", {}))

    def save(self) -> None:
        """Write the state file (after every start, so `down` finds partial stacks too)."""
        data = {"urls": self.urls, "processes": [p.to_dict() for p in self.processes],
                "info": self.info}
        tmp = self.workdir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.workdir / STATE_FILE)

    def process(self, name: str) -> Process:
        """The process of a component or live job by name."""
        for process in self.processes:
            if process.name == name:
                return process
        raise StackError(f"no component {name!r} in {self.workdir}")

    @property
    def endpoints(self) -> dict[str, str]:
        """The five URLs of the ``status --json`` contract, plus ``sink`` (the ARGUS_SINK a
        training job posts its records to), ``targets`` (the folder of metrics targets) and
        ``act`` (the dry-run remediation plan: ``/plan``)."""
        out = {name: self.urls[name] for name in
               ("prometheus", "alertmanager", "processor", "scorer", "s3")}
        if "act" in self.urls:
            out["act"] = self.urls["act"]
        out["sink"] = self.sink
        out["targets"] = str(self.workdir / "targets")
        return out

    @property
    def sink(self) -> str:
        """The URL a training job's exporters post records to (its ARGUS_SINK)."""
        return f"{self.urls['processor']}/v1/records"

    def add_targets(self, job: str, targets: list[str]) -> Path:
        """Have Prometheus scrape a job's ranks (``host:port`` of each rank's /metrics): a
        file_sd file ``targets/JOB.json``, replaced whole; an empty list removes it."""
        if not job or "/" in job or job.startswith("."):
            raise StackError(f"job name {job!r}: expected a plain name (no '/')")
        for target in targets:
            host, sep, port = target.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise StackError(f"target {target!r}: expected HOST:PORT")
        path = self.workdir / "targets" / f"{job}.json"
        if not targets:
            path.unlink(missing_ok=True)
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": targets, "labels": {"argus_job": job}}],
                                  indent=1))
        tmp.replace(path)  # Prometheus never reads a half-written file
        return path

    def dead(self) -> list[str]:
        """Names of recorded processes that are not running."""
        return [p.name for p in self.processes if not p.running]

    # -- lifecycle ----------------------------------------------------------------------------
    def _add(self, process: Process, ready_url: str | None, timeout: float = 60.0) -> Process:
        self.processes.append(process)
        self.save()
        if ready_url:
            wait_ready(process, ready_url, timeout)
        return process

    def restart(self, name: str, timeout: float = 60.0) -> Process:
        """Stop one component and start it again with the same command (tests, operators)."""
        old = self.process(name)
        old.stop()
        env = self.info.get("env", {}).get(name)
        new = start(name, old.argv, self.workdir / "logs", env=env, url=old.url)
        self.processes[self.processes.index(old)] = new
        self.save()
        ready = self.info.get("ready", {}).get(name)
        if ready:
            wait_ready(new, ready, timeout)
        return new

    def down(self, timeout: float = 20.0) -> list[str]:
        """Stop every recorded process (live jobs first, S3 last); returns any left running."""
        left = []
        for process in reversed(self.processes):
            if not process.stop(timeout):
                left.append(process.name)
        if not left:
            (self.workdir / STATE_FILE).unlink(missing_ok=True)
        return left


def up(config: StackConfig) -> Stack:
    """Generate the configs and start every component; on any failure stop what started."""
    workdir = config.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / STATE_FILE).exists():
        existing = Stack.load(workdir)
        if len(existing.dead()) < len(existing.processes):
            raise StackError(f"a stack is already running in {workdir}; "
                             f"`argus stack down --workdir {workdir}` first")
        existing.down()
    try:
        rules = config.rules
    except (OSError, ValueError) as exc:
        raise StackError(f"rules config: {exc}") from None
    if config.engine not in engines.ENGINES:
        raise StackError(f"--engine {config.engine!r}: expected one of "
                         f"{', '.join(engines.ENGINES)}")
    for name in (*engines.programs(config.engine), "prometheus-alertmanager", "moto_server"):
        binary(name)
    jobs = [_live_job(case, config) for case in config.simulate]  # validate before starting

    host = config.host
    names = (*COMPONENTS, *engines.components(config.engine))
    addr = {name: f"{host}:{free_port(host)}" for name in names}
    url = {name: f"http://{a}" for name, a in addr.items()}
    store = engines.components(config.engine)[0]  # stores, and answers the query API
    query = url[store]
    stack = Stack(workdir, urls={**url, "prometheus": query,
                                 "alerts": str(workdir / "alerts.ndjson")})
    scale = config.time_scale
    window_s = 60.0 / scale
    files = write_configs(workdir, rules, f"{url['webhook']}/alerts", addr["processor"],
                          addr["scorer"], addr["alertmanager"],
                          engines.own_scrape_targets(config.engine, addr), config.engine,
                          addr["act"])
    s3_env = {"AWS_ENDPOINT_URL": url["s3"], "AWS_ACCESS_KEY_ID": "argus",
              "AWS_SECRET_ACCESS_KEY": "argus", "AWS_DEFAULT_REGION": "us-east-1"}
    python = [sys.executable, "-m", "argus_core.cli"]
    logs = workdir / "logs"
    stack.info = {"time_scale": scale, "engine": config.engine, "env": {"processor": s3_env},
                  "ready": {}, "bucket": BUCKET, "jobs": [job for job, _ in jobs]}
    commands = {
        "s3": ([binary("moto_server"), "-H", host, "-p", addr["s3"].rsplit(":", 1)[1]],
               url["s3"] + "/"),
        "processor": ([*python, "processor", "--listen", addr["processor"],
                       "--store", f"s3://{BUCKET}/argus", "--spool", str(workdir / "spool"),
                       "--window", f"{window_s:g}", "--grace", f"{max(10.0 / scale, 0.5):g}"],
                      url["processor"] + "/readyz"),
        "webhook": ([sys.executable, "-m", "argus_core.stack.webhook", "--listen",
                     addr["webhook"], "--out", stack.urls["alerts"]],
                    url["webhook"] + "/"),
        "alertmanager": ([binary("prometheus-alertmanager"),
                          f"--config.file={files['alertmanager']}",
                          f"--storage.path={workdir / 'alertmanager-data'}",
                          f"--web.listen-address={addr['alertmanager']}",
                          "--cluster.listen-address="], url["alertmanager"] + "/-/ready"),
        "scorer": ([*python, "score", "--prometheus", query, "--listen", addr["scorer"],
                    "--interval", f"{window_s:g}", "--window", f"{window_s:g}",
                    "--rate-window", format_duration(rules.rate_window),
                    "--timeout", f"{max(window_s, 2.0):g}",
                    # the rules' L2 source decides which L2 findings the scorer publishes
                    "--l2-findings", "all" if rules.l2_source == L2_SCORER else "beyond-promql",
                    *engines.scorer_flags(config.engine, rules)],
                   url["scorer"] + "/metrics"),
        # a dry run: the plan for the suspects ArgusSuspectUnit names, on /plan and /metrics
        "act": ([*python, "act", "--listen", addr["act"], "--prometheus", query,
                 "--hold", f"{600.0 / scale:g}s", "--budget-window", f"{3600.0 / scale:g}s",
                 "--audit", str(workdir / "act-audit.ndjson")], url["act"] + "/metrics"),
    }
    for component in engines.commands(config.engine, binary, rules, workdir, addr, files,
                                      addr["alertmanager"]):
        commands[component.name] = (component.argv, component.ready)
    try:
        # S3 and its bucket first: the processor is ready only once its store takes files;
        # likewise the engine's store before the engine's scrapers and ruler. Every other
        # component only needs the others' addresses, known already: start them all, then
        # wait for each.
        for name in names:
            argv, ready = commands[name]
            stack.info["ready"][name] = ready
            process = stack._add(start(name, argv, logs, env=stack.info["env"].get(name),
                                       url=url[name]), None)
            if name == "s3":
                wait_ready(process, ready, timeout=120)
                _create_bucket(url["s3"], s3_env)
            elif name == store:  # the scrapers and the ruler write to it from their start
                wait_ready(process, ready, timeout=120)
        for process in stack.processes:
            wait_ready(process, stack.info["ready"][process.name], timeout=120)
        for job, argv in jobs:
            targets = files["targets"] / f"{job}.json"
            argv += ["--processor", f"{url['processor']}/v1/records", "--targets",
                     str(targets), "--listen", host,
                     "--step-seconds", f"{NOMINAL_STEP_S / scale:g}"]
            process = stack._add(start(f"live-{job}", [*python, *argv], logs), None)
            _wait_for_file(process, targets)
    except Exception:
        stack.down()
        raise
    return stack


def _live_job(case: str, config: StackConfig) -> tuple[str, list[str]]:
    """The job name and ``argus simulate --live`` arguments for a case."""
    from argus_core.simulate.cases import CASES
    from argus_core.topology import Topology

    if case not in CASES:
        raise StackError(f"--simulate {case!r}: unknown case (known: {', '.join(CASES)})")
    argv = ["simulate", "--live", "--case", case, "--job", case,
            "--fault-delay", str(LIVE_FAULT_DELAY_STEPS)]
    if config.ranks is not None:
        topo = CASES[case].topology
        others = topo.tp * topo.pp * topo.ep
        if config.ranks % others or config.ranks < others:
            raise StackError(f"--ranks {config.ranks}: case {case} needs a multiple of "
                             f"tp x pp x ep = {others}")
        scaled = Topology(dp=config.ranks // others, tp=topo.tp, pp=topo.pp, ep=topo.ep)
        worst = max((r for f in CASES[case].all_faults() for r in f.ranks), default=-1)
        if worst >= scaled.world_size:
            raise StackError(f"--ranks {config.ranks}: case {case} injects a fault on rank "
                             f"{worst}")
        argv += ["--topology", str(scaled)]
    return case, argv


def _create_bucket(s3_url: str, env: dict) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_url, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          region_name=env["AWS_DEFAULT_REGION"])
    client.create_bucket(Bucket=BUCKET)


def _wait_for_file(process: Process, path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if not process.running:
            raise StackError(f"{process.name} exited during start-up; see {process.log}")
        if time.monotonic() > deadline:
            raise StackError(f"{process.name} wrote no targets file in {timeout:g} s")
        time.sleep(0.1)
