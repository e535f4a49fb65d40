"""``argus run -- COMMAND``: run a training command with Argus on, no code change needed.

Sets ``ARGUS_ENABLED=1`` (unless already set) and puts Argus's ``sitecustomize`` first on
PYTHONPATH, so every Python process the command starts (torchrun's workers included) times
its steps and optimizer phase. Other ``ARGUS_*`` variables pass through unchanged.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser("run", help="run a training command with Argus enabled",
                            description=__doc__.splitlines()[0],
                            usage="argus run [--sink URL] -- COMMAND [ARGS...]")
    p.add_argument("--sink", help="where records go (sets ARGUS_SINK), e.g. file:///spool")
    p.add_argument("--job", help="job name (sets ARGUS_JOB)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(run=run)


def autostart_dir() -> Path:
    """Directory holding Argus's sitecustomize.py."""
    import argus_exporters

    return Path(argus_exporters.__file__).parent / "_autostart"


def run(args: argparse.Namespace) -> int:
    """Run the command and return its exit status."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("argus run: error: nothing to run; usage: argus run -- COMMAND [ARGS...]",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("ARGUS_ENABLED", "1")
    if args.sink:
        env["ARGUS_SINK"] = args.sink
    if args.job:
        env["ARGUS_JOB"] = args.job
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(autostart_dir()),
                                                      env.get("PYTHONPATH")]))
    problem = settings_problem(env)
    if problem:
        print(f"argus run: error: {problem}", file=sys.stderr)
        return 2
    try:
        return subprocess.call(command, env=env)
    except FileNotFoundError:
        print(f"argus run: error: command not found: {command[0]}", file=sys.stderr)
        return 127


def settings_problem(env: dict[str, str]) -> str | None:
    """What the ranks' exporters would refuse in ``env`` (a bad ARGUS_* value, an unknown sink),
    checked once here so a bad setting stops the launch instead of leaving the job untraced."""
    from argus_exporters.config import ConfigError, Settings
    from argus_exporters.health import Health
    from argus_exporters.identity import RankIdentity
    from argus_exporters.sinks import create_sink

    try:
        settings = Settings.from_env(env)
        if settings.enabled:
            create_sink(settings, RankIdentity.from_env(env), Health()).shutdown()
    except ConfigError as exc:
        return str(exc)
    return None
