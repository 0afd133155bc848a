"""A job that can never fit on the cluster's nodes is created all the same (nodes may join), with a
Kubernetes-style `Warning: 299 - "can never fit on this cluster: ..."` header saying why."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.devicematching import LABEL_BLOCK
from gpuyard.platform.api.neverfit import never_fit_warnings
from gpuyard.state.context import Context
from tests.builders import make_node

YAML = {"Content-Type": "application/yaml"}


def job(
    name: str, *, replicas: int, gpus: int, resource: str = "nvidia.com/gpu", annotations: str = ""
) -> str:
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: {name}, namespace: team-a{annotations}}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: {replicas}
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1, {resource}: {gpus}}}}}}}]
"""


def two_v100_nodes(ctx: Context) -> None:
    ctx.store.create(make_node("n1", gpus=8, labels={LABEL_BLOCK: "x"}))
    ctx.store.create(make_node("n2", gpus=8, labels={LABEL_BLOCK: "y"}))


async def test_a_gang_larger_than_the_cluster_is_created_with_a_warning(client: Any, ctx: Context) -> None:
    two_v100_nodes(ctx)
    r = await client.post("/api/v1/jobs", data=job("big", replicas=3, gpus=8), headers=YAML)
    assert r.status == 201, await r.text()
    assert ctx.store.get("PyTorchJob", "team-a", "big") is not None
    assert r.headers.getall("Warning") == [
        '299 - "can never fit on this cluster: PyTorchJob team-a/big: Worker needs 3 pods of 8 GPUs, '
        "1 CPU placed together; the 2 nodes that may run it could hold 2 even empty (the largest: "
        '8 GPUs, 64 CPU)"',
        '299 - "can never fit on this cluster: PyTorchJob team-a/big: asks 24 GPUs, the cluster has 16"',
    ]


async def test_a_job_that_fits_the_empty_cluster_gets_no_warning_even_when_it_waits(
    client: Any, ctx: Context
) -> None:
    two_v100_nodes(ctx)
    r = await client.post("/api/v1/jobs", data=job("fits", replicas=2, gpus=8), headers=YAML)
    assert r.status == 201 and "Warning" not in r.headers
    # no node known yet: nothing can be said
    empty = Context.for_tests()
    stored = ctx.store.get("PyTorchJob", "team-a", "fits")
    assert never_fit_warnings(empty.store, [stored]) == []  # type: ignore[list-item]


async def test_a_required_block_none_can_hold_and_a_class_no_node_has(client: Any, ctx: Context) -> None:
    two_v100_nodes(ctx)
    required = ", annotations: {gpuyard.io/topology-required: block}"
    r = await client.post(
        "/api/v1/jobs", data=job("blocky", replicas=2, gpus=8, annotations=required), headers=YAML
    )
    assert r.status == 201
    assert r.headers.getall("Warning") == [
        '299 - "can never fit on this cluster: PyTorchJob team-a/blocky: topology-required block: none '
        "of the 2 blocks could hold the gang even empty (the most one block could hold: Worker 1 of "
        '2 pods)"'
    ]
    # the cluster grows: the same gang may fit now, and is answered without a warning
    ctx.store.create(make_node("n3", gpus=8, labels={LABEL_BLOCK: "x"}))
    r = await client.post(
        "/api/v1/jobs", data=job("blocky2", replicas=2, gpus=8, annotations=required), headers=YAML
    )
    assert r.status == 201 and "Warning" not in r.headers


async def test_a_multi_document_submit_names_each_job_that_can_never_fit(client: Any, ctx: Context) -> None:
    two_v100_nodes(ctx)
    body = "---\n".join([job("ok", replicas=1, gpus=8), job("huge", replicas=4, gpus=8)])
    r = await client.post("/api/v1/jobs", data=body, headers=YAML)
    assert r.status == 201
    warnings = r.headers.getall("Warning")
    assert warnings and all("PyTorchJob team-a/huge:" in w for w in warnings)
    assert {item["metadata"]["name"] for item in (await r.json())["items"]} == {"ok", "huge"}
