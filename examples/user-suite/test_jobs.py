"""Placement and quota expectations for team A's jobs, checked on a fake cluster in CI.

`gpuyard_cluster` (from gpuyard's pytest plugin) starts the whole platform in memory on a
virtual clock: `run_until(..., timeout=120)` is 120 *virtual* seconds and takes milliseconds.
"""

from pathlib import Path

HERE = Path(__file__).parent
JOBS = HERE / "jobs"


async def start(gpuyard_cluster):
    return await gpuyard_cluster(HERE / "cluster.yaml", quotas=HERE / "quotas.yaml")


async def test_quad_lands_on_one_nvlinked_quad(gpuyard_cluster):
    c = await start(gpuyard_cluster)
    job = await c.submit(JOBS / "quad.yaml")
    await c.run_until(job, "Running", timeout=120)

    c.assert_on_model(job, "V100")
    c.assert_on_one_node(job)
    c.assert_nvlink_connected(job)
    assert c.placement(job).gpus == 4
    c.assert_within_quota("team-a/gpus")


async def test_second_job_waits_for_team_a_quota(gpuyard_cluster):
    c = await start(gpuyard_cluster)
    quad = await c.submit(JOBS / "quad.yaml")
    await c.run_until(quad, "Running", timeout=120)

    sweep = await c.submit(JOBS / "sweep.yaml")
    await c.advance(300)
    c.assert_phase(sweep, "Queuing")
    c.assert_pending_because(sweep, "quota")
    print(c.explain(sweep))  # shown with -s: the reason a person reads
    c.assert_within_quota("team-a/gpus")

    await c.delete(quad)  # team A frees its GPUs: the sweep starts
    await c.run_until(sweep, "Running", timeout=120)


async def test_a_failed_gpu_moves_the_worker_to_healthy_nvlinked_gpus(gpuyard_cluster):
    c = await start(gpuyard_cluster)
    job = await c.submit(JOBS / "quad.yaml")
    await c.run_until(job, "Running", timeout=120)

    pod = c.placement(job).pods[0]
    await c.inject("gpu-fail", pod.node, gpu=pod.gpus[0])
    await c.run_until(job, "Running", timeout=300)
    moved = c.placement(job).pods[0]
    assert not (moved.node == pod.node and pod.gpus[0] in moved.gpus), c.placement(job)
    c.assert_nvlink_connected(job)


def test_job_files_are_valid():
    """The same check as `gpuyard validate jobs/*.yaml quotas.yaml --cluster cluster.yaml`."""
    from gpuyard.cli.validate import validate_files
    from gpuyard.devices.scenarios import load_scenario

    checked = validate_files(
        [*sorted(JOBS.glob("*.yaml")), HERE / "quotas.yaml"], scenario=load_scenario(HERE / "cluster.yaml")
    )
    assert checked.ok, "\n".join(checked.problems)
