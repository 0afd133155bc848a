"""Config: file, environment overrides, CLI overrides, and errors naming file and field."""

from __future__ import annotations

import pytest

from gpuyard.state.config import ConfigError, load_settings


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_settings()
    assert (s.server.host, s.server.port, s.backend.kind) == ("127.0.0.1", 8080, "fake")


def test_file_then_env_then_overrides(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server:\n  port: 9000\nbackend:\n  clock: virtual\n")
    assert load_settings(cfg).server.port == 9000
    monkeypatch.setenv("GPUYARD__SERVER__PORT", "9100")
    monkeypatch.setenv("GPUYARD__BACKEND__DATA_DIR", "/tmp/x")
    s = load_settings(cfg)
    assert s.server.port == 9100, "environment beats the file"
    assert s.backend.clock == "virtual" and s.backend.data_dir == "/tmp/x"
    assert load_settings(cfg, server={"port": 9200}).server.port == 9200, "flags beat the environment"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server:\n  port: 70000\n", "c.yaml: server.port: Input should be less than or equal to 65535"),
        ("server:\n  colour: red\n", "c.yaml: server.colour: unknown field"),
        ("backend:\n  kind: nomad\n", "c.yaml: backend.kind: Input should be 'fake' or 'kubernetes'"),
        ("- a\n- b\n", "c.yaml: expected a mapping of sections"),
        ("server: [\n", "c.yaml:2:1: not valid YAML"),
    ],
)
def test_bad_files_name_file_and_field(tmp_path, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert message in str(err.value)


def test_bad_env_value_is_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUYARD__SERVER__PORT", "eighty")
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_settings()


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml")
