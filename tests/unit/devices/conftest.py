"""Shared helpers for the device-topology tests: data files and brute-force references."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from gpuyard.devices.discovery import reset_warnings


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    """Each test sees NVML's log-once warnings afresh (they are process-wide)."""
    reset_warnings()


DATA = Path(__file__).resolve().parents[2] / "data" / "topo"
MATRICES = ("dgx1-v100-1.txt", "dgx-a100-1.txt", "pcie-l40s-1.txt", "nvlink-pairs-a30-1.txt")


def brute_ring(matrix: np.ndarray, gpus: tuple[int, ...]) -> float:
    """Best ring bottleneck by trying every order (first GPU fixed): the reference to test against."""
    if len(gpus) == 1:
        return math.inf
    if len(gpus) == 2:
        return float(matrix[gpus[0], gpus[1]])
    first, rest = gpus[0], gpus[1:]
    best = 0.0
    for perm in itertools.permutations(rest):
        order = (first, *perm)
        hop = min(float(matrix[order[i], order[(i + 1) % len(order)]]) for i in range(len(order)))
        best = max(best, hop)
    return best


def file_cells(name: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The raw cells of a data matrix, read naively (header names, row -> column -> label)."""
    lines = [line for line in (DATA / name).read_text().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.split()[0] == "GPU0")
    header = lines[start].split()
    names = header[: next(i for i, t in enumerate(header) if t in ("CPU", "NUMA"))]
    cells: dict[str, dict[str, str]] = {}
    for line in lines[start + 1 : start + 1 + len(names)]:
        toks = line.split()
        cells[toks[0]] = dict(zip(names, toks[1 : 1 + len(names)], strict=True))
    return names, cells
