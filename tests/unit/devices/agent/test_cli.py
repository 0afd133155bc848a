"""`gpuyard agent` flags: bad combinations exit 2 naming the flag; `--once --print` prints the node."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuyard.cli import main
from gpuyard.devices import get_preset, to_yaml

ENV = {"GPUYARD_SERVER": "", "GPUYARD_TOKEN": "", "NODE_NAME": ""}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--preset", "dgx-a100", "--topology", "x.yaml"], "--preset and --topology are exclusive"),
        (["--preset", "dgx-a100"], "--server (or $GPUYARD_SERVER) or --kubeconfig is required"),
        (["--dry-run", "--preset", "dgx-a100", "--device-plugin"], "--device-plugin needs --server"),
        (["--dry-run", "--resources", "gpu,tpu"], "unknown ['tpu']"),
        (["--kubeconfig", "kc.yaml", "--server", "http://x"], "are exclusive"),
    ],
)
def test_bad_flags_exit_2(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, ["agent", *args], env=ENV)
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_once_print_from_a_preset_and_from_a_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["agent", "--once", "--print", "--preset", "hgx-h100", "--node", "h9"], env=ENV
    )
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.output)
    assert doc["metadata"]["name"] == "h9" and len(doc["spec"]["gpus"]) == 8
    assert doc["metadata"]["labels"]["gpuyard.io/discovered-by"] == "preset"
    path = tmp_path / "node.yaml"
    path.write_text(to_yaml(get_preset("pcie-t4x4", node_name="t4-7")))
    result = CliRunner().invoke(
        main, ["agent", "--once", "--print", "--topology", str(path), "--node", "t4-7"], env=ENV
    )
    assert result.exit_code == 0, result.output
    assert [g["model"] for g in yaml.safe_load(result.output)["spec"]["gpus"]] == ["Tesla-T4"] * 4


def test_a_bad_agent_setting_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "gpuyard.yaml"
    config.write_text("agent:\n  health_interval: 0\n")
    result = CliRunner().invoke(main, ["agent", "--config", str(config), "--dry-run"], env=ENV)
    assert result.exit_code == 2, result.output
    assert "agent.health_interval" in result.output
    result = CliRunner().invoke(main, ["agent", "--dry-run"], env={**ENV, "GPUYARD__AGENT__RESYNC": "0.5"})
    assert result.exit_code == 2 and "resync" in result.output
