"""`gpuyard fake-nodes` connects through the backend's kubeconfig loading
(`gpuyard.kubecluster.client.load_configuration`): `$KUBECONFIG` when no file is given, and an
error naming `--kubeconfig` (CLI exit code 2) when the file cannot be loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuyard.cli import main
from gpuyard.kubecluster.client import ApiError
from gpuyard.kubecluster.fakenodes import connect
from gpuyard.testing.apiserver.fixture import RunningApiServer


async def test_connect_falls_back_to_kubeconfig_env(
    fake_apiserver: RunningApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(fake_apiserver.kubeconfig))
    api = await connect(None)
    try:
        assert api.configuration.host.rstrip("/") == fake_apiserver.url.rstrip("/")
    finally:
        await api.close()


async def test_connect_names_the_option_when_the_file_is_bad(tmp_path: Path) -> None:
    bad = tmp_path / "kc.yaml"
    bad.write_text("not: a kubeconfig\n")
    with pytest.raises(ApiError, match=r"^--kubeconfig: cannot load .*kc\.yaml"):
        await connect(str(bad))


def test_cli_exits_2_on_a_bad_kubeconfig(tmp_path: Path) -> None:
    bad = tmp_path / "kc.yaml"
    bad.write_text("not: a kubeconfig\n")
    result = CliRunner().invoke(
        main, ["fake-nodes", "--kubeconfig", str(bad), "--cluster", "configs/clusters/small.yaml"]
    )
    assert result.exit_code == 2
    assert "--kubeconfig: cannot load" in result.output
