"""``argus act`` as a service: Alertmanager posts to ``/webhook``, ``/plan`` shows the plan as
JSON, ``/metrics`` exposes it for Prometheus and the Suspects dashboard.

Bodies are bounded (``MAX_BODY``, a Content-Length required), a client that stops sending is
dropped after ``READ_TIMEOUT_S``, a bad body is answered 400 naming what is wrong and changes
nothing; a ticker re-evaluates the plan every ``tick_s`` so a hold runs out between
notifications. With ``--prometheus``, a job's hosts come from ``argus_rank_info`` (so the last
node of a job is never drained); a query that fails refuses to drain rather than guess.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from argus_core.act.plan import STATES, Planner

log = logging.getLogger("argus_core.act")
MAX_BODY = 4 * 1024 * 1024  # an Alertmanager notification of a few hundred alerts
READ_TIMEOUT_S = 10.0  # longest wait for a client's next bytes


class PlanCollector:
    """Prometheus collector of a planner's plan and decisions."""

    def __init__(self, planner: Planner):
        self.planner = planner

    def collect(self):
        """Prometheus collector protocol."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        plan = GaugeMetricFamily(
            "argus_act_plan", "One suspect unit and what the plan does about it (value 1; "
            "state: holding, planned, executed, failed, refused_budget, refused_last_node, "
            "ticket, resolved).", labels=["job", "unit_kind", "unit", "cause", "node", "state"])
        for step in self.planner.plan():
            plan.add_metric([step["job"], step["unit_kind"], step["unit"], step["cause"],
                             step["node"], step["state"]], 1.0)
        yield plan
        decisions = CounterMetricFamily("argus_act_decisions", "Decisions taken, by state.",
                                        labels=["state"])
        counts = dict(self.planner.decisions)
        for state in STATES:
            decisions.add_metric([state], counts.get(state, 0))
        yield decisions
        execute = GaugeMetricFamily("argus_act_execute", "1 when commands run, 0 in a dry run.")
        execute.add_metric([], float(self.planner.config.execute))
        yield execute


def job_hosts_from(api):
    """``job -> hosts`` from ``argus_rank_info`` (none when the query fails: then nothing of
    the job is drained)."""
    from argus_core.score.prometheus import QueryError, quote_label

    def hosts(job: str) -> set[str] | None:
        try:
            series = api.query(f"argus_rank_info{{job={quote_label(job)}}}")
        except QueryError as exc:
            log.warning("argus act: hosts of job %s unknown (%s): not draining", job, exc)
            return set()
        return {s["metric"].get("host", "") for s in series} - {""}

    return hosts


def make_handler(planner: Planner, registry):
    """The request handler: /webhook (POST), /plan, /metrics, / (GET)."""
    from prometheus_client import generate_latest

    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # a client that stops sending is dropped, its thread freed

        def do_POST(self):
            if self.path.rstrip("/") != "/webhook":
                self.send_error(404, "POST to /webhook")
                return
            text = self.headers.get("Content-Length") or ""
            if not text.isdecimal():
                self.send_error(411 if not text else 400,
                                f"Content-Length: expected a byte count, got {text[:40]!r}")
                return
            length = int(text)
            if length > MAX_BODY:
                self.send_error(413, f"body over {MAX_BODY} bytes")
                return
            try:
                body = self.rfile.read(length)
            except TimeoutError:  # the client stopped sending: drop it
                self.close_connection = True
                return
            try:
                planner.notify(json.loads(body))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                self.send_error(400, str(exc)[:300])
                return
            self._answer(200, b"ok\n", "text/plain")

        def do_GET(self):
            if self.path.startswith("/metrics"):
                self._answer(200, generate_latest(registry), "text/plain; version=0.0.4")
            elif self.path.startswith("/plan"):
                self._answer(200, json.dumps(planner.plan(), indent=1).encode(),
                             "application/json")
            else:
                self._answer(200, b"argus act: POST Alertmanager notifications to /webhook; "
                             b"GET /plan, /metrics\n", "text/plain")

        def _answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


def serve(planner: Planner, host: str, port: int, tick_s: float = 5.0,
          stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(PlanCollector(planner))
    server = ThreadingHTTPServer((host, port), make_handler(planner, registry))
    server.daemon_threads = True
    stop = stop or threading.Event()

    def ticker():
        while not stop.wait(tick_s):
            planner.tick()
        server.shutdown()

    threading.Thread(target=ticker, name="argus-act-tick", daemon=True).start()
    log.info("argus act: listening on http://%s:%d (%s)", host, port,
             "executing commands" if planner.config.execute else "dry run")
    server.serve_forever()
    server.server_close()
