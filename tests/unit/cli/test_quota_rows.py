"""`gpuyard get quotas` rows: the resources a quota sets, uses, or is asked for by pending jobs."""

from __future__ import annotations

from gpuyard.cli.quotas import quota_rows


def quota(**status: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "team-b", "namespace": "default"},
        "spec": {"min": {"nvidia.com/gpu": "8"}, "max": {}},
        "status": {"runtime": {}, "used": {}, "request": {}, **status},
    }


def resources(rows: list[list[object]]) -> list[object]:
    return [row[1] for row in rows]


def test_a_resource_only_asked_for_gets_a_row() -> None:
    q = quota(
        used={"nvidia.com/gpu": "4", "cpu": "0", "memory": "0"},
        request={"nvidia.a100": "32", "nvidia.t4": "0"},
    )
    assert resources(quota_rows([q])) == ["nvidia.a100", "nvidia.com/gpu"]


def test_wide_shows_every_resource() -> None:
    q = quota(used={"cpu": "0"}, request={"nvidia.t4": "0"})
    assert resources(quota_rows([q], wide=True)) == ["cpu", "nvidia.com/gpu", "nvidia.t4"]
