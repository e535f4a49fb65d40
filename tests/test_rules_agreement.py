"""The rules agree with the core: for the paper's five cases, a healthy run and random fault
specs, a promtool test generated from the simulated job (exporter metrics sampled as scrapes,
and the scorer's L2 findings computed by its own code at each round) expects exactly the
alerts that the core's L1/L2 findings imply, and passes; in both ``l2_source`` modes (the
scorer's findings alone, or the rules' PromQL comparisons and the scorer's rest).

Random specs draw a topology and one fault (compute, stall, link, one rank's link) per seed;
a spec whose findings move when the core's thresholds move by a small margin
(``scenarios.margins``) is redrawn: there the core's whole-run estimators and the rules'
rolling windows may legitimately decide differently. ``ARGUS_AGREEMENT_SEEDS=N`` runs N seeds
(CI runs a few; docs/rules.md gives the count run before a release)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from promtools import promtool_test
from rules_scenarios import SCENARIO_TIME_SCALE, stretched, write_scenario

from argus_core.rules.config import L2_SOURCES, RulesConfig
from argus_core.simulate.cases import CASES
from argus_core.simulate.faults import parse_fault
from argus_core.simulate.model import SimConfig
from argus_core.topology import Topology, axis_groups

SEEDS = int(os.environ.get("ARGUS_AGREEMENT_SEEDS", "2"))
COMPUTE_PHASES = ("attention", "mlp", "backward", "optimizer")


def rules_for(source: str) -> RulesConfig:
    """The scenarios' rules (time-scaled) with L2 from ``source``."""
    return dataclasses.replace(RulesConfig().scaled(SCENARIO_TIME_SCALE), l2_source=source)


@pytest.mark.parametrize("source", L2_SOURCES)
@pytest.mark.parametrize("name", list(CASES))
def test_rules_agree_with_the_core_on_the_papers_cases(name, source, tmp_path):
    path, expected = write_scenario(stretched(CASES[name], 4), tmp_path, rules_for(source))
    assert not expected.borderline, expected.borderline
    result = promtool_test(path)
    assert result.returncode == 0, f"core found {expected}; promtool:\n{result.stdout[-4000:]}"


def random_spec(rng: np.random.Generator) -> tuple[Topology, str]:
    """A topology and one fault spec in ``argus simulate --fault`` syntax: groups of three or
    more (the rules' comparisons) or pairs only and pipeline stages (the scorer's), a compute
    straggler, a host stall, a link slow for a whole group, or one rank's link slow with
    nobody arriving late (an asymmetric transfer)."""
    topology = Topology(dp=int(rng.choice([2, 4, 6, 8])), tp=int(rng.choice([1, 2])),
                        pp=int(rng.choice([1, 2, 4])))
    world = topology.world_size
    kind = rng.choice(["compute", "stall", "link", "local-link"])
    start = int(rng.integers(50, 80))
    axes = [a for a in ("dp", "tp", "pp") if getattr(topology, a) > 1]
    axis = str(rng.choice(axes))
    groups = axis_groups(topology.coords(), axis)
    members = np.flatnonzero(groups == rng.integers(groups.max() + 1))
    if kind == "compute":
        phases = rng.choice(COMPUTE_PHASES, size=int(rng.integers(1, 3)), replace=False)
        spec = ",".join(f"{p}*{rng.uniform(2, 6):.2f}" for p in phases)
        return topology, f"compute:ranks={rng.integers(world)}:phases={spec}:from={start}"
    if kind == "stall":
        steps = sorted({int(s) for s in rng.integers(50, 120, size=int(rng.integers(1, 3)))})
        return topology, (f"stall:ranks={rng.integers(world)}:steps="
                          f"{','.join(map(str, steps))}:seconds={rng.uniform(1, 3):.2f}")
    if kind == "local-link":
        return topology, (f"link:ranks={rng.choice(members)}:axis={axis}:"
                          f"factor={rng.uniform(3, 8):.2f}:from={start}:local=1")
    return topology, (f"link:ranks={','.join(map(str, members))}:axis={axis}:"
                      f"factor={rng.uniform(3, 8):.2f}:from={start}")


@pytest.mark.parametrize("source", L2_SOURCES)
@pytest.mark.parametrize("seed", range(SEEDS))
def test_rules_agree_with_the_core_on_random_faults(seed, source, tmp_path):
    rng = np.random.default_rng(1000 + seed)
    for attempt in range(20):
        topology, spec = random_spec(rng)
        config = SimConfig(job=f"random-{seed}", topology=topology,
                           faults=(parse_fault(spec),), seed=seed * 100 + attempt)
        path, expected = write_scenario(config, tmp_path, rules_for(source))
        if not expected.borderline:
            break
    else:
        pytest.fail("no spec away from every threshold in 20 draws")
    result = promtool_test(path)
    assert result.returncode == 0, (f"{topology} {spec}: core found {expected}; promtool:\n"
                                    f"{result.stdout[-4000:]}")
