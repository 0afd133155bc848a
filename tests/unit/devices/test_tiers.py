"""Link labels and their order, and locality classes."""

from __future__ import annotations

import pytest

from gpuyard.devices import Link, LinkTier, Locality, get_preset, parse_link
from gpuyard.devices.tiers import gpu_locality, link_matrix, locality_matrix


@pytest.mark.parametrize(
    ("text", "tier", "links"),
    [
        ("X", LinkTier.X, 0),
        (" X ", LinkTier.X, 0),
        ("NV1", LinkTier.NV, 1),
        ("NV18", LinkTier.NV, 18),
        ("PIX", LinkTier.PIX, 0),
        ("PXB", LinkTier.PXB, 0),
        ("PHB", LinkTier.PHB, 0),
        ("NODE", LinkTier.NODE, 0),
        ("SYS", LinkTier.SYS, 0),
        ("SOC", LinkTier.SYS, 0),
    ],
)
def test_parse_link(text: str, tier: LinkTier, links: int) -> None:
    link = parse_link(text)
    assert (link.tier, link.nvlinks) == (tier, links)
    assert link.label == ("SYS" if text == "SOC" else text.strip())


@pytest.mark.parametrize("text", ["NV", "NV0", "NV01", "nv2", "PCI", "", "NVx", "SYS2"])
def test_parse_link_rejects_with_allowed_list(text: str) -> None:
    with pytest.raises(ValueError, match="allowed: X, NV<n>"):
        parse_link(text)


def test_order_closest_first() -> None:
    labels = ["SYS", "NV1", "PIX", "X", "NODE", "NV18", "PHB", "NV2", "PXB", "NV12"]
    ordered = sorted((parse_link(t) for t in labels), key=lambda link: link.rank)
    assert [link.label for link in ordered] == [
        "X",
        "NV18",
        "NV12",
        "NV2",
        "NV1",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
    ]
    assert list(LinkTier) == sorted(LinkTier)
    assert str(Link(LinkTier.NV, 4)) == "NV4"


def test_locality_uses_structure_for_nvlink_pairs() -> None:
    topo = get_preset("dgx1-v100")
    assert gpu_locality(topo, 0, 1) is Locality.SWITCH  # NV1, same PCIe switch
    assert gpu_locality(topo, 0, 3) is Locality.PCIE  # NV2, same host bridge
    assert gpu_locality(topo, 0, 4) is Locality.SYSTEM  # NV2 across sockets
    assert gpu_locality(topo, 2, 2) is Locality.SWITCH
    loc = locality_matrix(topo)
    assert (loc == loc.T).all()
    assert loc[0, 5] == Locality.SYSTEM


def test_link_matrix_is_symmetric_with_x_diagonal() -> None:
    for preset in ("dgx1-v100", "k80", "pcie-t4x4"):
        m = link_matrix(get_preset(preset))
        n = len(m)
        assert all(m[i][i].label == "X" for i in range(n))
        assert all(m[i][j] == m[j][i] for i in range(n) for j in range(n))
