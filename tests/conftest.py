"""Shared fixtures: simulated traces built through the real schema parser, and a real moto S3
server on loopback (started once per session; outage tests stop and restart it)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import boto3
import orjson
import pytest
from support import free_port

from argus_core.schema import parse_record
from argus_core.simulate import simulate
from argus_core.simulate.model import SimConfig
from argus_core.stack.processes import start_child, stop_child
from argus_core.trace import Trace, TraceBuilder


def build_trace(config: SimConfig) -> Trace:
    """Simulate, round-trip every record through JSON and the schema parser, build the trace."""
    builder = TraceBuilder()
    for _, record in simulate(config):
        builder.add(parse_record(orjson.loads(orjson.dumps(
            record, option=orjson.OPT_SERIALIZE_NUMPY))))
    return builder.finish()[config.job]


@pytest.fixture
def trace_of():
    """Factory fixture: trace_of(SimConfig) -> Trace."""
    return build_trace


MOTO_SERVER = Path(sys.executable).parent / "moto_server"


class MotoServer:
    """A ``moto_server`` subprocess on a fixed loopback port that tests can stop and restart."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it answers HTTP."""
        log = Path(tempfile.gettempdir()) / f"argus-tests-moto-{self.port}.log"
        self.proc = start_child([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)],
                                self.url + "/", log, timeout, 0.05)

    def stop(self) -> None:
        """Stop the server (its buckets and objects are gone afterwards)."""
        stop_child(self.proc, 10)
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port (state is lost: recreate buckets)."""
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def moto():
    """One moto S3 server on a free loopback port for the whole session."""
    if not MOTO_SERVER.exists():
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    server = MotoServer(free_port())
    server.start()
    yield server
    server.stop()


class S3:
    """The S3 test environment: a fresh bucket on the moto server, and a boto3 client for it."""

    def __init__(self, server: MotoServer, bucket: str):
        self.server = server
        self.bucket = bucket
        self.client = boto3.client("s3", endpoint_url=server.url)

    def url(self, prefix: str = "argus") -> str:
        """The store URL of this bucket with a prefix."""
        return f"s3://{self.bucket}/{prefix}"

    def create_bucket(self) -> None:
        """Create the bucket (again, after a restart)."""
        self.client.create_bucket(Bucket=self.bucket)

    def objects(self) -> dict[str, bytes]:
        """Every object in the bucket: key -> bytes."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        keys = [item["Key"] for page in pages for item in page.get("Contents", ())]
        return {key: self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                for key in keys}


@pytest.fixture
def s3_env(moto, monkeypatch, tmp_path):
    """AWS settings pointing at the moto server, isolated from any real configuration."""
    if not moto.running:  # a previous test failed while the server was down
        moto.start()
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN",
                 "ARGUS_S3_ADDRESSING_STYLE", "ARGUS_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    yield moto
    if not moto.running:
        moto.start()


@pytest.fixture
def s3(s3_env) -> S3:
    """A fresh, existing bucket for this test."""
    env = S3(s3_env, f"argus-{uuid.uuid4().hex[:12]}")
    env.create_bucket()
    return env


@pytest.fixture
def s3_no_bucket(s3_env) -> S3:
    """A bucket name that does not exist yet: every put fails until ``create_bucket()``."""
    return S3(s3_env, f"argus-{uuid.uuid4().hex[:12]}")


