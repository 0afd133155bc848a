"""Packing policies across workload variants: GPU allocation at 100 % and 130 % arrived load.

The openb saturation experiment (`gpuyard.sim.openb.run_openb`, the FGD paper's Fig. 7 setup) on
openb's default pod list and on variants derived from it (`gpuyard.sim.variants`: more GPU-share
pods, more multi-GPU pods, GPU-model-constrained pods, more CPU-only pods). A policy tuned on the
default trace must also hold on the variants: this is the validation set.

    .venv/bin/python bench/packing_variants.py                 # default: 10 seeds; variants: 3 seeds
    .venv/bin/python bench/packing_variants.py --small         # CI size: 1 seed, 3 variants
    .venv/bin/python bench/packing_variants.py --policies fgd,gpuyard,best-fit --variants share-40

Prints one JSON object: per workload and policy the mean allocation % at 100 % and 130 % arrived
load over the seeds, the per-seed values, and per workload the margin of each policy over FGD.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.sim.openb import run_openb
from gpuyard.sim.traces import load_openb_nodes, load_openb_pods
from gpuyard.sim.variants import VALIDATION_SET, make_variant

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "openb"
POINTS = (100, 130)


def _data_dir(given: str | None) -> Path:
    for candidate in [Path(given)] if given else [DATA]:
        if (candidate / "openb_pod_list_default.csv").exists():
            return candidate
    raise SystemExit(
        "openb data not found: pass --data DIR holding openb_node_list_gpu_node.csv and openb_pod_list_default.csv"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="directory with the openb node and pod lists")
    parser.add_argument("--policies", default="fgd,gpuyard")
    parser.add_argument("--variants", default=",".join(VALIDATION_SET))
    parser.add_argument("--default-seeds", type=int, default=10)
    parser.add_argument("--variant-seeds", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="1 seed each, three variants")
    args = parser.parse_args()
    data = _data_dir(args.data)
    nodes = load_openb_nodes(data / "openb_node_list_gpu_node.csv")
    source = load_openb_pods(data / "openb_pod_list_default.csv")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    default_seeds, variant_seeds = args.default_seeds, args.variant_seeds
    if args.small:
        variants, default_seeds, variant_seeds = variants[:3], 1, 1
    workloads = [("default", default_seeds)] + [(v, variant_seeds) for v in variants]
    out: dict[str, object] = {"benchmark": "packing_variants", "points": POINTS, "workloads": {}}
    started = time.perf_counter()
    for name, seeds in workloads:
        per_policy: dict[str, dict[str, object]] = {}
        for policy in policies:
            values = {p: [] for p in POINTS}
            for k in range(seeds):
                seed = 42 + k
                pods = source if name == "default" else make_variant(source, nodes, name=name, seed=seed)
                result = run_openb(nodes, pods, policy=policy, seed=seed)
                for p in POINTS:
                    values[p].append(round(result.alloc_at(p), 3))
            per_policy[policy] = {
                **{f"mean_{p}": round(float(np.mean(values[p])), 3) for p in POINTS},
                **{f"seeds_{p}": values[p] for p in POINTS},
            }
        if "fgd" in per_policy:
            for row in per_policy.values():
                for p in POINTS:
                    row[f"vs_fgd_{p}"] = round(row[f"mean_{p}"] - per_policy["fgd"][f"mean_{p}"], 3)  # type: ignore[operator]
        out["workloads"][name] = {"seeds": seeds, "policies": per_policy}  # type: ignore[index]
        print(
            f"{name}: " + ", ".join(f"{p} {r['mean_100']}/{r['mean_130']}" for p, r in per_policy.items()),
            file=sys.stderr,
        )
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
