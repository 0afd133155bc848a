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


def test_a_limit_the_quota_does_not_set_is_none_not_zero_or_inf() -> None:
    """kubectl-like: `-` (None) where min or max does not name the resource; a set 0 stays 0."""
    q = quota(used={"cpu": "4", "nvidia.com/gpu": "2"})
    q["spec"] = {"min": {"nvidia.com/gpu": "8", "cpu": "0"}, "max": {"nvidia.com/gpu": "16"}}
    rows = {row[1]: row[2:4] for row in quota_rows([q])}
    assert rows == {"cpu": ["0", None], "nvidia.com/gpu": ["8", "16"]}
    q["spec"] = {"max": {"memory": "0"}}
    rows = {row[1]: row[2:4] for row in quota_rows([q])}
    assert rows == {"cpu": [None, None], "memory": [None, "0"], "nvidia.com/gpu": [None, None]}
