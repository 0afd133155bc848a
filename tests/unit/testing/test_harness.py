"""The harness used directly (`async with Cluster.start(...)`): inputs, placement, faults, assertion text."""

from __future__ import annotations

import pytest

from gpuyard.testing import BadInput, Cluster, nodes_scenario

JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: quad, namespace: team-a}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
            - {name: pytorch, image: train, resources: {limits: {nvidia.com/gpu: 4}}}
"""
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "gpus", "namespace": "team-a"},
    "spec": {"hard": {"requests.nvidia.com/gpu": "4"}},
}


def test_nodes_become_a_scenario_named_after_presets() -> None:
    data = nodes_scenario([("dgx1-v100", 2), "dgx-a100", ("dgx1-v100", 1)])
    assert [(g["name"], g["count"], g["topology"]) for g in data["nodeGroups"]] == [
        ("dgx1-v100", 2, "dgx1-v100"),
        ("dgx-a100", 1, "dgx-a100"),
        ("dgx1-v100-g1", 1, "dgx1-v100"),
    ]


async def test_bad_scenario_and_policies_name_field_and_allowed_values(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadInput, match=r"nodes\[0\]: unknown topology preset 'dgx9'; allowed: dgx1-v100"):
        await Cluster.launch(nodes=[("dgx9", 1)])
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodeGroups:\n  - name: n\n    gpu: {model: z9, count: 8}\n")
    with pytest.raises(BadInput, match=r"nodeGroups.0.gpu.model: .*unknown GPU model 'z9'; allowed: a10"):
        await Cluster.launch(bad)
    negative = {**QUOTA, "spec": {"hard": {"requests.nvidia.com/gpu": "-1"}}}
    with pytest.raises(BadInput, match=r"spec.hard.requests.nvidia.com/gpu: must not be negative"):
        await Cluster.launch(nodes=["dgx1-v100"], quotas=negative)
    with pytest.raises(BadInput, match="cannot read quotas file"):
        await Cluster.launch(nodes=["dgx1-v100"], quotas=tmp_path / "missing.yaml")


async def test_quad_placement_link_tier_and_assertions() -> None:
    async with Cluster.start(nodes=[("dgx1-v100", 2)], quotas=QUOTA) as c:
        job = await c.submit(JOB)
        await c.run_until(job, "Running", timeout=120)
        placed = c.placement(job)
        assert placed.gpus == 4 and len(placed.nodes) == 1
        pod = placed.pods[0]
        assert pod.gpu_model == "v100" and pod.gpu_product.startswith("Tesla-V100")
        assert placed.links[pod.node].startswith("NV") and pod.link.startswith("NV")
        c.assert_on_model(job, "v100")
        c.assert_nvlink_connected(job)
        c.assert_within_quota("gpus")
        with pytest.raises(AssertionError) as wrong_model:
            c.assert_on_model(job, "A100")
        assert "team-a/quad expected on A100 GPUs, but quad-worker-0 on dgx1-v100-" in str(wrong_model.value)
        assert "Tesla-V100" in str(wrong_model.value)
        with pytest.raises(AssertionError, match=r"team-a/quad is Running, expected Succeeded"):
            c.assert_phase(job, "Succeeded")

        second = await c.submit(JOB.replace("quad", "second"))
        await c.advance(60)
        assert c.placement(second).pods == []
        c.assert_pending_because(second, "ResourceQuota team-a/gpus")
        with pytest.raises(
            AssertionError, match=r"pending, but not because of 'NVLink'\n  scheduler: job is Queuing"
        ):
            c.assert_pending_because(second, "NVLink")
        with pytest.raises(
            AssertionError, match=r"team-a/second is Queuing \(after 30 virtual seconds\), expected Running"
        ):
            await c.run_until(second, "Running", timeout=30)


async def test_nvlink_failure_message_shows_the_link_matrix() -> None:
    sys_job = JOB.replace("quad", "spread").replace("nvidia.com/gpu: 4", "nvidia.com/gpu: 8")
    async with Cluster.start(nodes=["dgx1-v100"]) as c:
        job = await c.submit(sys_job)
        await c.run_until(job, "Running", timeout=120)
        with pytest.raises(AssertionError) as info:
            c.assert_nvlink_connected(job)
        text = str(info.value)
        assert (
            "team-a/spread is not NVLink-connected: on dgx1-v100-0 the weakest link between its GPUs is SYS"
            in text
        )
        assert "GPU0  X      NV1" in text


async def test_submit_is_all_or_nothing_and_names_duplicates() -> None:
    async with Cluster.start(nodes=["dgx1-v100"]) as c:
        bad = JOB.replace("replicas: 1", "replicas: -1") + "---\n" + JOB.replace("quad", "other")
        assert c.problems(bad) == [
            "<job text>: documents[0]: spec.pytorchReplicaSpecs.Worker.replicas: must be a non-negative integer (0, 1, 2, ...); got -1"
        ]
        with pytest.raises(
            BadInput, match=r"invalid job manifest:\n  <job text>: documents\[0\]: spec.pytorchReplicaSpecs"
        ):
            await c.submit_all(bad)
        assert c.phase("team-a/other") == ""
        too_big = JOB.replace("nvidia.com/gpu: 4", "nvidia.com/gpu: 16")
        assert c.problems(too_big) == [
            "<job text>: spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits.nvidia.com/gpu: "
            "requests 16 nvidia.com/gpu per pod; the largest node has 8"
        ]
        await c.submit(JOB)
        with pytest.raises(BadInput, match="team-a/quad already exists"):
            await c.submit(JOB)


async def test_faults_node_gpu_and_pod_crash() -> None:
    restart = JOB.replace("replicas: 1", "replicas: 1\n      restartPolicy: OnFailure")
    async with Cluster.start(nodes=[("dgx1-v100", 2)]) as c:
        job = await c.submit(restart)
        await c.run_until(job, "Running", timeout=120)
        with pytest.raises(BadInput, match="unknown fault 'explode'; allowed: node-fail, node-recover"):
            await c.inject("explode", "x")
        with pytest.raises(BadInput, match="no node 'nope'; allowed: dgx1-v100-0, dgx1-v100-1"):
            await c.inject("node-fail", "nope")
        with pytest.raises(BadInput, match=r"gpu-fail needs gpu=<index>; allowed: 0..7"):
            await c.inject("gpu-fail", "dgx1-v100-0", gpu=9)
        assert await c.inject("pod-crash", "team-a/quad-worker-0", exit_code=137) == 1
        await c.run_until(job, "Running", timeout=120)
        assert c.job(job).status.restarts == 1
        node = c.placement(job).pods[0].node
        assert await c.inject("node-fail", node) == 1
        await c.run_until(job, "Running", timeout=300)
        assert c.placement(job).pods[0].node != node
        await c.inject("node-recover", node)
