"""How often the diagnosis names the hardware unit that was degraded (issue 24's proof).

Simulated jobs of 64, 512 and 4,096 ranks (8 GPUs a host, GPUs in pairs behind a PCIe switch
and NIC, hosts under leaf switches), one unit degraded per job (a GPU, NIC, host or leaf
switch, chosen at random per seed), two at once (on different leaves, of random kinds), and
healthy jobs. For each, ``diagnose`` runs and its ``suspects`` are compared with the truth:

- right: the degraded unit is named (kind and name);
- extra: a suspect that is no degraded unit (a wrong unit, or a merge of two faults);
- healthy jobs: suspects of any kind.

    python bench/attribution_sweep.py                 # 20 / 10 / 5 seeds at 64 / 512 / 4,096
    python bench/attribution_sweep.py --sizes 64 --seeds 50
    python bench/attribution_sweep.py --gpu 1.15 --link 1.5 --host 0.005   # smaller faults
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from argus_core.detect.diagnose import diagnose
from argus_core.hardware import rank_units
from argus_core.simulate.model import SimConfig, simulate_trace
from argus_core.simulate.placement import Hardware, UnitFault
from argus_core.topology import Topology

LAYOUTS = {64: (6, 2), 512: (8,), 4096: (16,)}  # hosts per leaf
DEFAULT_SEEDS = {64: 20, 512: 10, 4096: 5}
KINDS = ("gpu", "nic", "host", "leaf")


SIZES = {"gpu": 1.5, "link": 3.0, "host_s": 0.02}  # the faults' sizes (--gpu, --link, --host)


def _faults(kind: str, size: int, rng: np.random.Generator, avoid_leaf: set[str],
            sizes: dict[str, float]) -> UnitFault:
    """A random unit of ``kind`` under a leaf not in ``avoid_leaf`` (and never the majority
    leaf of a two-leaf job: a fault of most of the job has no healthy majority to compare)."""
    hardware = Hardware(hosts_per_leaf=LAYOUTS[size])
    ranks = hardware.rank_records("sweep", Topology(dp=size // 8, tp=8))
    units = {r: rank_units(info) for r, info in ranks.items()}
    leaves = sorted({u["leaf"] for u in units.values()}, key=lambda n: int(n.split("-")[1]))
    allowed = [leaf for leaf in leaves if leaf not in avoid_leaf and (
        kind != "leaf" or sum(u["leaf"] == leaf for u in units.values()) <= size // 2)]
    leaf = allowed[int(rng.integers(len(allowed)))]
    under = [r for r, u in units.items() if u["leaf"] == leaf]
    rank = under[int(rng.integers(len(under)))]
    name = units[rank][kind]
    if kind == "gpu":
        return UnitFault("gpu", name, factor=sizes["gpu"], start=10)
    if kind == "host":
        return UnitFault("host", name, seconds=sizes["host_s"], start=10)
    return UnitFault(kind, name, factor=sizes["link"], start=10)


def run_one(size: int, seed: int, kinds: tuple[str, ...],
            sizes: dict[str, float] = SIZES) -> dict:
    """Diagnose one job with ``kinds`` units degraded; what was named against the truth."""
    rng = np.random.default_rng([size, seed, len(kinds), *map(KINDS.index, kinds)])
    hardware = Hardware(hosts_per_leaf=LAYOUTS[size])
    topology = Topology(dp=size // 8, tp=8)
    ranks = hardware.rank_records("sweep", topology)
    truth, avoid = [], set()
    for kind in sorted(kinds, key=lambda k: k != "leaf"):  # a leaf first: it needs a minority
        unit = _faults(kind, size, rng, avoid, sizes)
        truth.append(unit)
        leaf_of = {rank_units(i)[unit.kind]: rank_units(i)["leaf"] for i in ranks.values()}
        avoid.add(leaf_of[unit.name])
    faults = tuple(f for unit in truth for f in unit.faults(ranks))
    config = SimConfig(job="sweep", topology=topology, seed=seed, hardware=hardware,
                       faults=faults)
    started = time.perf_counter()
    suspects = diagnose(simulate_trace(config)).to_json()["suspects"]
    named = {(s["unit_kind"], s["unit"]) for s in suspects}
    true = {(u.kind, u.name) for u in truth}
    return {"size": size, "kinds": kinds, "right": len(true & named), "faults": len(true),
            "extra": len(named - true), "seconds": time.perf_counter() - started}


def main() -> None:
    """Run the sweep and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(LAYOUTS),
                        choices=list(LAYOUTS))
    parser.add_argument("--seeds", type=int, help="seeds per size (default 20 / 10 / 5)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--gpu", type=float, default=SIZES["gpu"],
                        help="a GPU fault's compute slowdown (default 1.5)")
    parser.add_argument("--link", type=float, default=SIZES["link"],
                        help="a NIC or leaf fault's transfer slowdown (default 3)")
    parser.add_argument("--host", type=float, default=SIZES["host_s"],
                        help="a host fault's stall a step, seconds (default 0.02)")
    args = parser.parse_args()
    sizes = {"gpu": args.gpu, "link": args.link, "host_s": args.host}
    scenarios = [(k,) for k in KINDS] + [("gpu", "nic"), ("leaf", "host"), ("nic", "nic"),
                                          ("gpu", "leaf"), ()]
    jobs = [(size, seed, kinds) for size in args.sizes
            for seed in range(args.seeds or DEFAULT_SEEDS[size]) for kinds in scenarios]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_one, *zip(*jobs, strict=True), [sizes] * len(jobs)))
    print(f"{'ranks':>6} {'faults':<12} {'jobs':>5} {'right unit':>11} {'extra suspects':>15}"
          f" {'s/job':>6}")
    for size in args.sizes:
        for kinds in scenarios:
            rows = [r for r in results if r["size"] == size and r["kinds"] == kinds]
            right = sum(r["right"] for r in rows)
            total = sum(r["faults"] for r in rows)
            label = "+".join(kinds) or "healthy"
            share = f"{right}/{total} ({right / total:.0%})" if total else "-"
            print(f"{size:>6} {label:<12} {len(rows):>5} {share:>11} "
                  f"{sum(r['extra'] for r in rows):>15} "
                  f"{np.mean([r['seconds'] for r in rows]):>6.1f}")
    summary = {}
    for size in args.sizes:
        rows = [r for r in results if r["size"] == size]
        right, total = sum(r["right"] for r in rows), sum(r["faults"] for r in rows)
        extra = sum(r["extra"] for r in rows)
        summary[size] = {"right": right, "faults": total, "extra_suspects": extra,
                         "jobs": len(rows)}
        print(f"{size} ranks: right unit {right}/{total} ({right / total:.1%}), extra "
              f"suspects {extra} in {len(rows)} jobs")
    if args.json:
        print(json.dumps({"sizes": sizes, "by_ranks": summary}))


if __name__ == "__main__":
    main()
