"""Every job file of `configs/jobs/` (KubeDL's and Kubeflow's, as those projects write them) runs to
Succeeded on the Kubernetes backend: created through the API server as `kubectl apply` would, its
pods created and bound by gpuyard, played by fake nodes (`gpuyard fake-nodes`), its status written
back. One platform and one cluster for all of them at once (they queue for the GPUs they share).
KubeDL's and Kubeflow's XGBoost examples share a name upstream (the samples here do not): Kubeflow's,
created again under KubeDL's name, clashes with it; the later one fails, naming the clash, and runs
once the first is deleted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from gpuyard.apis.resources import resource_for
from gpuyard.devices.scenarios import load_scenario
from gpuyard.kubecluster import fakenodes
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import connect, platform, settings

__all__ = ["served"]

ROOT = Path(__file__).resolve().parents[2]
JOB_FILES = sorted((ROOT / "configs" / "jobs").glob("*.yaml"))


XGBOOST = (
    resource_for("XGBoostJob", "training.kubedl.io/v1alpha1"),
    resource_for("XGBoostJob", "kubeflow.org/v1"),
)
CLASH = yaml.safe_load((ROOT / "configs" / "jobs" / "xgboost-kubedl.yaml").read_text())["metadata"]["name"]
"""KubeDL's iris sample's name, which Kubeflow's iris example also has upstream."""


def shorten(doc: dict[str, Any]) -> None:
    """The fake kubelet's run time of every pod (`fake.gpuyard.io/duration`, the demo's 120 s) cut
    to half a second; nothing else of the file changes."""
    spec = doc.get("spec") or {}
    for key, value in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(value, dict):
            for replica in value.values():
                annotations = ((replica.get("template") or {}).get("metadata") or {}).get("annotations") or {}
                if "fake.gpuyard.io/duration" in annotations:
                    annotations["fake.gpuyard.io/duration"] = "0.5"


def finished(obj: dict[str, Any] | None) -> str | None:
    """Succeeded or Failed, from the job's last condition; None while it runs."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    last = conditions[-1]["type"] if conditions else None
    return last if last in ("Succeeded", "Failed") else None


async def test_every_job_file_runs_to_succeeded_with_pods_bound_by_gpuyard(served: FakeApiServerView) -> None:
    scenario = load_scenario(ROOT / "configs" / "clusters" / "demo.yaml")
    kubelet = scenario.kubelet.model_copy(update={"start_delay": 0.1, "duration": 0.5})
    scenario = scenario.model_copy(update={"kubelet": kubelet})
    api = await fakenodes.connect(str(served.kubeconfig))
    client = await connect(served)
    async with api:
        nodes = fakenodes.FakeNodes(api, scenario=scenario, heartbeat=1.0)
        play = asyncio.create_task(nodes.run())
        try:
            await asyncio.wait_for(nodes.registered.wait(), 20)
            async with platform(settings(served.kubeconfig, election=False)):
                jobs: list[tuple[Any, str, str]] = []
                for path in JOB_FILES:
                    for doc in yaml.safe_load_all(path.read_text()):
                        if not doc:
                            continue
                        res = resource_for(doc["kind"], doc["apiVersion"])
                        ns = doc["metadata"].get("namespace") or "default"
                        doc["metadata"]["namespace"] = ns
                        served.ensure_namespace(ns)  # `kubectl create namespace`, as a user would first
                        shorten(doc)
                        await client.create(res, doc)
                        jobs.append((res, ns, doc["metadata"]["name"]))
                assert len(jobs) >= len(JOB_FILES)
                # the upstream examples' clash: Kubeflow's iris job under KubeDL's sample's name
                clash = yaml.safe_load((ROOT / "configs" / "jobs" / "xgboost-kubeflow.yaml").read_text())
                clash["metadata"].update(name=CLASH, namespace="default")
                shorten(clash)
                await client.create(XGBOOST[1], clash)
                jobs.append((XGBOOST[1], "default", CLASH))
                loop = asyncio.get_running_loop()
                end = loop.time() + 120
                outcome: dict[str, str | None] = {}
                while loop.time() < end:
                    outcome = {
                        f"{res.plural}.{res.group}/{ns}/{name}": finished(await client.get(res, ns, name))
                        for res, ns, name in jobs
                    }
                    if all(outcome.values()):
                        break
                    await asyncio.sleep(0.2)
                # KubeDL's and Kubeflow's iris XGBoostJob have one name in one namespace: the one
                # created first (same second: by group name) runs, the other fails naming the clash
                name = CLASH
                pair = {res: f"{res.plural}.{res.group}/default/{name}" for res in XGBOOST}
                clashing = {key: outcome.pop(key) for key in pair.values()}
                assert sorted(clashing.values()) == ["Failed", "Succeeded"]

                def outcome_of(key: str) -> str | None:
                    return clashing[key]

                for res in XGBOOST:
                    conditions = (await client.get(res, "default", name))["status"]["conditions"]
                    failed = [c for c in conditions if c["type"] == "Failed" and c["status"] == "True"]
                    if failed:
                        (other,) = [r for r in XGBOOST if r is not res]
                        assert failed[0]["reason"] == "InvalidSpec"
                        assert f"of {other.group} was created first" in failed[0]["message"]
                assert {k: v for k, v in outcome.items() if v != "Succeeded"} == {}, outcome
                # the winner goes: the job that lost the name is fetched again and runs
                (winner,) = [r for r in XGBOOST if outcome_of(pair[r]) == "Succeeded"]
                (loser,) = [r for r in XGBOOST if r is not winner]
                await client.delete(winner, "default", name)
                for _ in range(300):
                    if finished(await client.get(loser, "default", name)) == "Succeeded":
                        break
                    await asyncio.sleep(0.2)
                rerun = await client.get(loser, "default", name)
                assert finished(rerun) == "Succeeded", rerun.get("status")
                assert not any(c.get("reason") == "InvalidSpec" for c in rerun["status"]["conditions"])
                bound = {pod for pod in served.bindings()}
                pods = [p for p in served.list("pods") if (p["metadata"].get("labels") or {}).get("job-name")]
                assert pods and all(
                    (p["metadata"]["namespace"], p["metadata"]["name"]) in bound for p in pods
                )
                assert all(p["spec"]["schedulerName"] == "gpuyard" for p in pods)
        finally:
            play.cancel()
            await asyncio.gather(play, return_exceptions=True)
            await client.close()
