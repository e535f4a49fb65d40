"""The stack's webhook receiver: every notification Alertmanager posts, one JSON line each.

``python -m argus_core.stack.webhook --listen 127.0.0.1:9095 --out DIR/alerts.ndjson``. Each
line is the notification (Alertmanager's webhook payload: ``receiver``, ``status``, ``alerts``
with their labels and annotations...) plus ``received_at`` (unix seconds), so a test or a
person can see which alert arrived when.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_handler(out: Path):
    """A request handler appending each POSTed JSON document to ``out``."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length)
            try:
                document = json.loads(body)
            except json.JSONDecodeError:
                self.send_error(400, "expected a JSON body")
                return
            document["received_at"] = time.time()
            with lock, out.open("a") as f:
                f.write(json.dumps(document) + "\n")
            self.send_response(200)
            self.end_headers()

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"argus webhook receiver\n")

        def log_message(self, *args):
            pass

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--out", required=True, metavar="FILE")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    ThreadingHTTPServer((host, int(port)), make_handler(out)).serve_forever()


if __name__ == "__main__":
    main()
