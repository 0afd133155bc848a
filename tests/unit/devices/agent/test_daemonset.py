"""The agent's DaemonSet manifest is valid Kubernetes and wires what the agent reads."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from gpuyard.cli.agent import agent_command

MANIFEST = Path(__file__).resolve().parents[4] / "configs" / "deploy" / "agent-daemonset.yaml"


def test_manifest_validates_and_matches_the_cli() -> None:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    for doc in docs:
        for version in ("1.30.0", kubernetes_validate.utils.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    container = pod["containers"][0]
    assert container["securityContext"]["privileged"] is False
    flags = {o for p in agent_command.params for o in p.opts}
    assert {a for a in container["command"] if a.startswith("--")} <= flags
    env = {e["name"] for e in container["env"]}
    assert {"NODE_NAME", "GPUYARD_SERVER", "GPUYARD_TOKEN"} <= env
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubelet/device-plugins" in mounts
    sysfs = container["command"][container["command"].index("--sysfs") + 1]
    assert sysfs in mounts
