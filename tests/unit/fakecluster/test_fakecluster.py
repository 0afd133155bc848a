"""The fake cluster on the virtual clock: lifecycle, faults, scenarios."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gpuyard.apis.scheduling import ANNOTATION_DEVICES
from gpuyard.devices.scenarios import ScenarioError, load_scenario, parse_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.state.backend import BackendError, ClusterBackend, FaultError, FaultInjector
from gpuyard.state.context import Context
from tests.builders import make_pod

SCENARIO = {
    "name": "t",
    "kubelet": {"startDelay": 5, "duration": 100, "exitCode": 0},
    "nodeGroups": [
        {"name": "gpu", "count": 2, "cpu": "32", "memory": "256Gi", "gpu": {"model": "v100", "count": 8}}
    ],
}


@pytest.fixture
async def cluster():
    ctx = Context.for_tests()
    fake = FakeCluster(ctx, parse_scenario(SCENARIO, source="test"))
    ctx.backend, ctx.writer = fake, fake.writer
    task = asyncio.create_task(fake.run())
    await fake.synced.wait()
    yield ctx, fake
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_nodes_come_from_the_scenario(cluster):
    ctx, _ = cluster
    nodes = ctx.store.list("Node")
    assert [n.metadata.name for n in nodes] == ["gpu-0", "gpu-1"]
    assert nodes[0].status.allocatable["nvidia.com/gpu"] == 8
    assert nodes[0].metadata.labels["gpuyard.io/gpu-model"] == "v100"
    assert nodes[0].ready


async def test_an_hour_long_pod_completes_in_well_under_a_second(cluster):
    ctx, fake = cluster
    pod = make_pod("long", node="gpu-0", annotations={"fake.gpuyard.io/duration": "3600"})
    await fake.writer.create(pod)
    started = time.perf_counter()
    await ctx.clock.advance(4)
    assert ctx.store.get("Pod", "default", "long").status.phase == "Pending"
    await ctx.clock.advance(2)
    running = ctx.store.get("Pod", "default", "long")
    assert running.status.phase == "Running" and running.status.pod_ip
    await ctx.clock.advance(3600)
    done = ctx.store.get("Pod", "default", "long")
    assert done.status.phase == "Succeeded" and done.status.exit_code == 0
    assert time.perf_counter() - started < 1.0
    assert ctx.clock.elapsed == pytest.approx(3606)


async def test_exit_code_annotation_fails_the_pod(cluster):
    ctx, fake = cluster
    await fake.writer.create(make_pod("bad", node="gpu-0", annotations={"fake.gpuyard.io/exit-code": "3"}))
    await ctx.clock.advance(200)
    pod = ctx.store.get("Pod", "default", "bad")
    assert (pod.status.phase, pod.status.exit_code, pod.status.reason) == ("Failed", 3, "Error")


async def test_create_pod_requires_a_known_node_and_can_be_made_to_fail(cluster):
    ctx, fake = cluster
    with pytest.raises(BackendError, match="nodeName"):
        await fake.writer.create(make_pod("unbound"))
    with pytest.raises(BackendError, match="does not exist"):
        await fake.writer.create(make_pod("ghost", node="nope"))
    fake.faults.fail_next_creates(1)
    with pytest.raises(BackendError, match="injected"):
        await fake.writer.create(make_pod("p", node="gpu-0"))
    await fake.writer.create(make_pod("p", node="gpu-0"))
    assert ctx.store.get("Pod", "default", "p") is not None


async def test_node_failure_fails_its_pods_with_node_lost_and_recovers(cluster):
    ctx, fake = cluster
    await fake.writer.create(make_pod("a", node="gpu-0"))
    await fake.writer.create(make_pod("b", node="gpu-1"))
    await ctx.clock.advance(10)
    assert await fake.faults.fail_node("gpu-0") == 1
    a, b = ctx.store.get("Pod", "default", "a"), ctx.store.get("Pod", "default", "b")
    assert (a.status.phase, a.status.reason) == ("Failed", "NodeLost")
    assert b.status.phase == "Running"
    assert not ctx.store.get("Node", "", "gpu-0").ready
    # a pod bound to a NotReady node does not start
    await fake.writer.create(make_pod("c", node="gpu-0"))
    await ctx.clock.advance(50)
    assert ctx.store.get("Pod", "default", "c").status.phase == "Pending"
    await fake.writer.create(make_pod("d", node="gpu-0", namespace="other"))  # one more comes
    await fake.faults.recover_node("gpu-0")
    await ctx.clock.advance(1)
    assert ctx.store.get("Node", "", "gpu-0").ready
    assert ctx.store.get("Pod", "default", "c").status.phase == "Running"
    await ctx.clock.advance(5)  # its start delay
    assert ctx.store.get("Pod", "other", "d").status.phase == "Running"


async def test_crash_with_exit_code_or_reason(cluster):
    ctx, fake = cluster
    for name in ("x", "y", "z"):
        await fake.writer.create(make_pod(name, node="gpu-0"))
    await ctx.clock.advance(10)
    assert (await fake.faults.crash_pod("default", "x", exit_code=137)).status.exit_code == 137
    oom = await fake.faults.crash_pod("default", "y", reason="OOMKilled")
    assert (oom.status.reason, oom.status.exit_code) == ("OOMKilled", 137)
    evicted = await fake.faults.crash_pod("default", "z", reason="Evicted")
    assert (evicted.status.phase, evicted.status.reason, evicted.status.exit_code) == (
        "Failed",
        "Evicted",
        None,
    )
    with pytest.raises(FaultError, match="already finished"):
        await fake.faults.crash_pod("default", "x", exit_code=1)


async def test_a_crash_reason_follows_the_exit_code_as_the_kubelet_reports_it(cluster):
    ctx, fake = cluster
    for name in ("oom", "ok", "err"):
        await fake.writer.create(make_pod(name, node="gpu-0"))
    await ctx.clock.advance(10)
    oom = await fake.faults.crash_pod("default", "oom", exit_code=137)
    assert (oom.status.phase, oom.status.reason) == ("Failed", "OOMKilled")
    assert oom.status.container_statuses[0].state.terminated["reason"] == "OOMKilled"
    ok = await fake.faults.crash_pod("default", "ok", exit_code=0)
    assert (ok.status.phase, ok.status.reason) == ("Succeeded", "Completed")
    assert ok.status.container_statuses[0].state.terminated["reason"] == "Completed"
    err = await fake.faults.crash_pod("default", "err", exit_code=2)
    assert (err.status.phase, err.status.reason) == ("Failed", "Error")


async def test_gpu_failure_fails_only_pods_on_that_gpu(cluster):
    ctx, fake = cluster
    on3 = make_pod("on3", node="gpu-0", annotations={ANNOTATION_DEVICES: json.dumps({"gpus": [2, 3]})})
    on5 = make_pod("on5", node="gpu-0", annotations={ANNOTATION_DEVICES: json.dumps({"gpus": [5]})})
    await fake.writer.create(on3)
    await fake.writer.create(on5)
    await ctx.clock.advance(10)
    assert await fake.faults.fail_gpu("gpu-0", 3) == 1
    assert ctx.store.get("Pod", "default", "on3").status.reason == "DeviceUnhealthy"
    assert ctx.store.get("Pod", "default", "on5").status.phase == "Running"
    assert fake.faults.unhealthy_gpus("gpu-0") == {3}
    await fake.faults.recover_gpu("gpu-0", 3)
    assert fake.faults.unhealthy_gpus("gpu-0") == set()


def test_bundled_scenarios_load():
    demo = load_scenario("configs/clusters/demo.yaml")
    assert demo.total_gpus >= 32
    assert len({g.gpu.model for g in demo.node_groups if g.gpu}) >= 3


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodeGroups": []}, "nodeGroups: List should have at least 1 item"),
        (
            {"nodeGroups": [{"name": "a", "gpu": {"model": "x100", "count": 1}}]},
            "nodeGroups.0.gpu.model: Value error, unknown GPU model 'x100'",
        ),
        (
            {"nodeGroups": [{"name": "a", "cpu": "lots"}]},
            "nodeGroups.0.cpu: Value error, 'lots' is not a quantity",
        ),
        (
            {"nodeGroups": [{"name": "a", "count": 0}]},
            "nodeGroups.0.count: Input should be greater than or equal to 1",
        ),
        ({"nodeGroups": [{"name": "a", "colour": "red"}]}, "nodeGroups.0.colour: unknown field"),
        ({"nodeGroups": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
    ],
)
def test_bad_scenarios_name_the_field(data, message):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data, source="bad.yaml")
    assert str(err.value).startswith("bad.yaml: ")
    assert message in str(err.value)


def test_bad_yaml_names_line_and_column(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("nodeGroups:\n  - name: a\n   count: [\n")
    with pytest.raises(ScenarioError, match=r"broken.yaml:\d+:\d+: not valid YAML"):
        load_scenario(p)


async def test_topology_presets_become_node_topologies(cluster):
    ctx, _ = cluster
    assert ctx.store.list("NodeTopology") == [], "groups without a topology have none"
    scenario = parse_scenario(
        {"nodeGroups": [{"name": "dgx", "count": 2, "topology": "dgx1-v100"}, {"name": "cpu", "count": 1}]},
        source="t",
    )
    group = scenario.node_groups[0]
    assert (group.gpu.model, group.gpu.count) == ("v100", 8), "the GPU spec comes from the preset"
    topos = scenario.topologies()
    assert [t.metadata.name for t in topos] == ["dgx-0", "dgx-1"]
    assert topos[0].spec.gpus[0].uuid != topos[1].spec.gpus[0].uuid
    other = FakeCluster(ctx, scenario)
    await other.sync_nodes()
    assert ctx.store.get("NodeTopology", "", "dgx-1") is not None
    await other.faults.fail_gpu("dgx-1", 2)
    health = [g.health for g in ctx.store.get("NodeTopology", "", "dgx-1").spec.gpus]
    assert health[2] == "Unhealthy" and health.count("Healthy") == 7


def test_topology_and_gpu_spec_must_agree():
    with pytest.raises(ScenarioError, match="topology dgx-a100 has 8 x a100; gpu says 4 x a100"):
        parse_scenario(
            {"nodeGroups": [{"name": "a", "topology": "dgx-a100", "gpu": {"model": "a100", "count": 4}}]},
            source="t",
        )
    with pytest.raises(ScenarioError, match="unknown topology preset 'dgx-9'"):
        parse_scenario({"nodeGroups": [{"name": "a", "topology": "dgx-9"}]}, source="t")


def test_topology_file_is_imported_and_errors_name_line_and_column(tmp_path):
    import shutil

    shutil.copy("tests/data/topo/dgx1-v100-1.txt", tmp_path / "dgx1.txt")
    (tmp_path / "s.yaml").write_text(
        "nodeGroups:\n  - name: real\n    gpu: {model: v100, count: 8}\n    topologyFile: dgx1.txt\n"
    )
    scenario = load_scenario(tmp_path / "s.yaml")
    topo = scenario.topologies()[0]
    assert topo.metadata.name == "real-0" and topo.gpu_count == 8
    (tmp_path / "bad.txt").write_text("\tGPU0\tGPU1\nGPU0\t X \tNV9X\nGPU1\tNV1\t X \n")
    (tmp_path / "b.yaml").write_text(
        "nodeGroups:\n  - name: bad\n    gpu: {model: v100, count: 2}\n    topologyFile: bad.txt\n"
    )
    with pytest.raises(ScenarioError, match=r"nodeGroups\.0\.topologyFile: bad\.txt:2:\d+: "):
        load_scenario(tmp_path / "b.yaml")


async def test_the_fake_cluster_is_a_backend_with_faults_and_no_pod_methods_in_the_protocol(cluster):
    ctx, fake = cluster
    assert isinstance(fake, ClusterBackend)
    assert isinstance(fake.faults, FaultInjector)
    assert ctx.writer is fake.writer
    for gone in ("create_pod", "delete_pod", "apply_service", "delete_service"):
        assert not hasattr(ClusterBackend, gone), f"{gone} goes through the writer"


async def test_a_gpu_marked_unhealthy_in_its_topology_fails_the_pods_using_it():
    """Whoever writes the health (an agent through the writer), the fake kubelet fails the pods."""
    ctx = Context.for_tests()
    scenario = parse_scenario(
        {"nodeGroups": [{"name": "dgx", "count": 1, "topology": "dgx1-v100"}]}, source="t"
    )
    fake = FakeCluster(ctx, scenario)
    ctx.backend, ctx.writer = fake, fake.writer
    task = asyncio.create_task(fake.run())
    try:
        await fake.synced.wait()
        for name, gpus in (("on1", [0, 1]), ("on4", [4])):
            pod = make_pod(name, node="dgx-0", annotations={ANNOTATION_DEVICES: json.dumps({"gpus": gpus})})
            await ctx.writer.create(pod)
        await ctx.clock.advance(5)
        topo = ctx.store.get("NodeTopology", "", "dgx-0").clone()
        topo.spec.gpus[1].health = "Unhealthy"
        await ctx.writer.update(topo)
        await ctx.clock.advance(0.1)
        on1, on4 = ctx.store.get("Pod", "default", "on1"), ctx.store.get("Pod", "default", "on4")
        assert (on1.status.phase, on1.status.reason) == ("Failed", "DeviceUnhealthy")
        assert on4.status.phase == "Running"
        node = ctx.store.get("Node", "", "dgx-0")
        assert node.metadata.annotations["gpuyard.io/unhealthy-gpus"] == "1"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_go_style_duration_is_a_run_time_not_forever(cluster):
    ctx, fake = cluster
    pod = make_pod("go", node="gpu-0", annotations={"fake.gpuyard.io/duration": "1m30s"})
    await fake.writer.create(pod)
    await ctx.clock.advance(6)
    assert ctx.store.get("Pod", "default", "go").status.phase == "Running"
    await ctx.clock.advance(90)
    assert ctx.store.get("Pod", "default", "go").status.phase == "Succeeded"


async def test_a_duration_beyond_the_clock_never_crashes_it(cluster):
    """A pod written past validation with a run time no datetime can hold: it runs until deleted,
    and the clock (which stamps every later object) keeps working."""
    ctx, fake = cluster
    pod = make_pod("far", node="gpu-0", annotations={"fake.gpuyard.io/duration": "3e11"})
    await fake.writer.create(pod)
    await ctx.clock.advance(10)
    assert ctx.store.get("Pod", "default", "far").status.phase == "Running"
    await ctx.clock.advance(1e12)
    assert ctx.clock.utcnow().year >= 2026
    await fake.writer.create(make_pod("after", node="gpu-0"))
    assert ctx.store.get("Pod", "default", "after") is not None
