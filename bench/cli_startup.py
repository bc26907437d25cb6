"""How long ``edgebnn --version``, ``--help`` and each ``COMMAND --help`` take (issue 45: under 0.5 s each).

Runs each as a fresh ``python -m edgebnn`` process ``--repeat`` times and reports, per command line, the fastest
and the median wall time and the median CPU time (user + system of the child: what the process itself costs,
less sensitive to other load on the machine than the wall time). Also the same for ``python -c pass`` (the
interpreter's own start) as a floor. Prints one JSON line (schema ``edgebnn.bench.cli_startup/1``):

    .venv/bin/python bench/cli_startup.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from edgebnn.cli import main as cli

SCHEMA = "edgebnn.bench.cli_startup/1"
GOAL_S = 0.5


def time_process(argv: list[str], repeat: int) -> dict[str, float]:
    """Fastest and median wall seconds, median CPU seconds of ``argv`` run ``repeat`` times."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {"wall_min_s": round(min(walls), 3), "wall_median_s": round(statistics.median(walls), 3),
            "cpu_median_s": round(statistics.median(cpus), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    edgebnn = [sys.executable, "-m", "edgebnn"]
    report: dict[str, Any] = {"schema": SCHEMA, "repeat": args.repeat, "goal_s": GOAL_S,
                              "python -c pass": time_process([sys.executable, "-c", "pass"], args.repeat)}
    lines = [["--version"], ["--help"], *([c, "--help"] for c in sorted(cli.commands))]
    report["commands"] = {f"edgebnn {' '.join(a)}": time_process([*edgebnn, *a], args.repeat) for a in lines}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
