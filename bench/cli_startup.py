"""How long `gpuyard` commands take to start: `gpuyard version`, `gpuyard --help` and the client
side of `gpuyard get jobs` (against a closed port, so the figure is start-up, import and one
refused connection, not a server's answer), each a fresh `python -m gpuyard.cli` process.

Target: `version` and `get jobs` under 0.3 s on an idle machine (issue 31). Prints JSON: per
command the runs' min / median / max seconds, and the modules `version` imports (how many, and
whether the platform, simulator or NumPy are among them). Usage:
`python bench/cli_startup.py [--runs N] [--small]`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time(argv: list[str], runs: int, env: dict[str, str]) -> dict[str, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", *argv], capture_output=True, env=env, check=False
        )
        times.append(time.perf_counter() - start)
    return {
        "min_s": round(min(times), 3),
        "median_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
    }


def _imports(env: dict[str, str]) -> dict[str, object]:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom gpuyard.cli import main\n"
        "CliRunner().invoke(main, ['version'])\n"
        "print(len(sys.modules)); print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    count, names = out.stdout.splitlines()[:2]
    loaded = set(names.split())
    heavy = ["numpy", "gpuyard.platform", "gpuyard.sim", "gpuyard.scheduler", "aiohttp", "pydantic"]
    return {"modules": int(count), "heavy_loaded": [m for m in heavy if m in loaded]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="Runs per command.")
    parser.add_argument("--small", action="store_true", help="CI-sized: 3 runs per command.")
    args = parser.parse_args()
    runs = 3 if args.small else args.runs
    env = {**os.environ, "GPUYARD_CONFIG": os.devnull + ".absent", "GPUYARD_TOKEN": "", "GPUYARD_SERVER": ""}
    server = f"http://127.0.0.1:{_closed_port()}"
    figures = {
        "runs": runs,
        "version": _time(["version"], runs, env),
        "get_jobs_refused": _time(["get", "jobs", "--server", server], runs, env),
        "help": _time(["--help"], max(1, runs // 3), env),
        "version_imports": _imports(env),
        "target_s": 0.3,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
