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


def test_cdi_and_the_mps_pipe_directory_reach_the_device_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuyard.cli import agent as agent_cli
    from gpuyard.devices.agent.allocating import AllocationOptions

    seen: list[AllocationOptions] = []

    async def fake_run(inventory: object, **kwargs: object) -> int:
        options = kwargs["options"]
        assert isinstance(options, AllocationOptions)
        seen.append(options)
        return 0

    monkeypatch.setattr(agent_cli, "_run", fake_run)
    base = ["agent", "--dry-run", "--preset", "dgx-a100"]
    assert CliRunner().invoke(main, base, env=ENV).exit_code == 0
    assert seen[-1] == AllocationOptions()  # no CDI, the default pipe directory
    config = tmp_path / "gpuyard.yaml"
    config.write_text("agent:\n  cdi: true\n  cdi_kind: example.com/gpu\n  mps_pipe_directory: /run/mps\n")
    assert CliRunner().invoke(main, [*base, "--config", str(config)], env=ENV).exit_code == 0
    assert (seen[-1].cdi, seen[-1].cdi_kind, seen[-1].mps_pipe_directory) == (
        True,
        "example.com/gpu",
        "/run/mps",
    )
    flags = [*base, "--config", str(config), "--no-cdi", "--mps-pipe-dir", "/var/run/nvidia-mps"]
    assert CliRunner().invoke(main, flags, env=ENV).exit_code == 0
    assert (seen[-1].cdi, seen[-1].mps_pipe_directory) == (False, "/var/run/nvidia-mps")  # flags win
    bad = CliRunner().invoke(main, [*base, "--mps-pipe-dir", "nvidia-mps"], env=ENV)
    assert bad.exit_code == 2 and "mps_pipe_directory" in bad.output and "absolute" in bad.output
