"""The README's Quickstart walkthrough, run as written: the commands of its marked block
(`<!-- walkthrough ... -->` to `<!-- /walkthrough -->`), in order, each through bash in the
repository root, against a fresh `gpuyard demo` (what `make run` starts) on a free port.

What differs from a reader's shell is only where the server is: the demo gets the free port through
`GPUYARD__SERVER__PORT` (as the README says for another port), the client commands through
`$GPUYARD_SERVER`, and the `curl` lines have `:8080` replaced by that port. `gpuyard` on `PATH`
is this interpreter's (the README's `source .venv/bin/activate`). Every command must exit 0, and
each output line the README shows must be found, by its first three words, in the command's
output, in the order shown (the jobs' ages, the ids and times of `describe` are left out)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
START, END = "<!-- walkthrough", "<!-- /walkthrough -->"
READY = re.compile(r"gpuyard demo: open http://127\.0\.0\.1:(\d+)/")

pytestmark = pytest.mark.skipif(
    shutil.which("curl") is None, reason="the walkthrough uses curl; not installed"
)


@dataclass
class Step:
    command: str
    shown: list[str] = field(default_factory=list)


def walkthrough(text: str) -> list[Step]:
    """The `$ ` commands of the marked section's console blocks, each with the lines shown under it."""
    start = text.index(START)
    section = text[start : text.index(END, start)]
    steps: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append(Step(line[2:]))
            elif line.strip() and steps:
                steps[-1].shown.append(line)
    return steps


def first_words(line: str) -> list[str]:
    return line.split()[:3]


def test_the_walkthrough_block_is_found_and_covers_the_basics() -> None:
    """The parser finds the block, and the block does what a newcomer needs: submit, list,
    describe, delete (a README edit that drops one fails here, not silently)."""
    commands = [s.command.split("#")[0].split() for s in walkthrough(README.read_text())]
    verbs = [c[1] for c in commands if c[0] == "gpuyard"]
    for verb in ("submit", "get", "describe", "delete"):
        assert verb in verbs, (verb, commands)
    assert verbs.index("submit") < verbs.index("delete")
    assert "`make run` starts `gpuyard demo`" in README.read_text()
    assert "$(BIN)/gpuyard demo" in (ROOT / "Makefile").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    steps = walkthrough(README.read_text())
    port = free_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "gpuyard"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpuyard.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        GPUYARD_CONFIG=str(tmp_path / "absent.yaml"),  # no config file of the developer's
        GPUYARD_SERVER=f"http://127.0.0.1:{port}",
    )
    demo = subprocess.Popen(
        ["gpuyard", "demo"],
        cwd=ROOT,
        env={**env, "GPUYARD__SERVER__PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            m = READY.search(line)
            if m and int(m.group(1)) == port:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # the README: once the sample jobs have started (a few seconds), the demo says where it is
        assert ready.wait(25), "".join(lines[-20:])
        for step in steps:
            command = step.command.replace(":8080", f":{port}")
            done = subprocess.run(
                ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=20
            )
            assert done.returncode == 0, (step.command, done.stdout, done.stderr)
            got = [first_words(line) for line in done.stdout.splitlines()]
            at = 0
            for shown in step.shown:
                want = first_words(shown)
                while at < len(got) and got[at] != want:
                    at += 1
                assert at < len(got), f"{step.command}: no line starting {want} in order in\n{done.stdout}"
                at += 1
    finally:
        demo.terminate()
        try:
            demo.wait(15)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()
        reader.join(5)
        if demo.stdout is not None:
            demo.stdout.close()
