"""``edgebnn search`` on the digits CNN: the 16x-within-budget goal, and the speed-up of 2 Ray workers over 1.

Trains the digits CNN (seed 0, as ``edgebnn demo`` does), imports it into the IR, then

1. searches 24 trials (seed 0, the default space, objectives bytes,nll,ece) with the budget
   ``nll=+0.05,ece=+0.01`` on the digits validation split (written to a ``val.npz``, the file a user gives
   ``--data``; ``--data digits`` reads the built-in split instead, whose loader imports scikit-learn in every
   worker: about 0.9 s more per worker start), and reports the best trial's size against the fp32 BNN
   (``float_bnn_bytes / bytes``, bytes: the exported ONNX file the trial deploys since ``edgebnn.search/2``,
   ``ir_bytes`` the lowered IR's; the goal is >= 16x) and its NLL/ECE changes; the Pareto plot goes to
   ``--plot``;
2. runs the same 24-trial search on a fresh local Ray instance with 1 worker, then with 2 (``--repeat`` times,
   alternating), each into a fresh study, and reports for each run the seconds to start Ray (``start_s``), to
   search (``search_s``: from the call to the last trial told; the workers' warm-up, the baseline and every
   trial), to stop Ray (``stop_s``), the end of each batch, and how many cores other processes kept busy
   meanwhile (``other_processes_cores``; 2 workers need both cores); then three ratios of 2 workers to 1:
   ``ray_2_over_1`` (``search_s``; the goal is <= 0.6), ``ray_2_over_1_after_first_batch`` (batches 2-4: warm
   workers, the same 18 trials) and ``ray_2_over_1_with_start_and_stop`` (the whole command), and whether every
   run gave the local search's trials.

Run from the repository root::

    .venv/bin/python bench/search_scale.py [--trials 24] [--runs 20] [--repeat 3] [--data val.npz|digits] \
        [--model digits_cnn.ebnn] [--json out.json] [--plot front.png]

Prints one JSON line on stdout and a summary on stderr. Wall times on a machine shared with other jobs vary
from run to run: compare only runs whose ``other_processes_cores`` is near 0. docs/search.md has the figures
measured and the machine they were measured on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BUDGET = "nll=+0.05,ece=+0.01"


def trained_ir(out: Path) -> Path:
    import torch

    from edgebnn import ir
    from edgebnn.data import digits
    from edgebnn.importers import import_model
    from edgebnn.models import digits_cnn
    from edgebnn.train import train_bnn

    torch.manual_seed(0)
    model = digits_cnn()
    torch.set_num_threads(1)
    train_bnn(model, digits(0), seed=0, progress=False)
    return ir.save(import_model(model, (1, 1, 8, 8), where="digits_cnn"), out / "digits_cnn.ebnn")


def strip_timing(report: dict) -> list[dict]:
    return [{k: v for k, v in t.items() if k not in ("latency_ms", "energy_mj", "energy_reason", "runner")}
            for t in report["trials"]]


def total(timing: dict) -> float:
    return timing["start_s"] + timing["search_s"] + timing["stop_s"]


def later(timing: dict) -> float:
    """Seconds from the end of the first batch to the end of the search: warm workers, the same trials."""
    return timing["search_s"] - timing["generations_end_s"][0]


def busy_ticks() -> tuple[int, int]:
    """Clock ticks the machine spent busy, and those this process and its descendants used (Linux /proc)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    machine = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # exited meanwhile
                continue
            rest = stat[stat.rindex(")") + 2:].split()
            parents[int(entry.name)], ticks[int(entry.name)] = int(rest[1]), int(rest[11]) + int(rest[12])
    mine = {os.getpid()}
    for _ in range(8):  # the driver, Ray's daemons, the workers they start
        mine |= {pid for pid, parent in parents.items() if parent in mine}
    return machine, sum(ticks[pid] for pid in mine if pid in ticks)


def ray_search(settings, study: Path, workers: int) -> tuple[dict, dict]:
    """One search on a fresh local Ray instance: the seconds to start it, to run the trials, and to stop it.

    ``search_s`` runs from the call to the last trial told (the progress callback), so it holds the workers'
    warm-up, the baseline and every trial; ``stop_s`` is the rest, mostly ``ray.shutdown``;
    ``generations_end_s`` is when each batch of ``population`` trials was told; ``other_processes_cores`` is
    how many cores other processes kept busy during the search (a run with 2 workers needs both cores).
    """
    from edgebnn.search import RayExecutor, run_search

    t0 = time.perf_counter()
    executor = RayExecutor(None, workers=workers).__enter__()  # the search re-enters it, then stops it
    started = time.perf_counter()
    told: list[float] = []
    ticks: list[tuple[int, int]] = [busy_ticks()]

    def progress(done: int, wanted: int, _result: dict) -> None:
        told.append(time.perf_counter())
        if done == wanted:
            ticks.append(busy_ticks())

    report = run_search(settings, study, executor, progress=progress)
    end = time.perf_counter()
    (machine0, mine0), (machine1, mine1) = ticks
    others = (machine1 - machine0 - (mine1 - mine0)) / os.sysconf("SC_CLK_TCK") / (told[-1] - started)
    generations = [round(t - started, 2) for t in told[settings.population - 1::settings.population]]
    return {"start_s": round(started - t0, 2), "search_s": round(told[-1] - started, 2),
            "stop_s": round(end - told[-1], 2), "generations_end_s": generations,
            "other_processes_cores": round(max(others, 0.0), 2)}, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per trial profile")
    parser.add_argument("--model", type=Path, help="an .ebnn to search instead of training the digits CNN")
    parser.add_argument("--data", choices=("val.npz", "digits"), default="val.npz",
                        help="the digits validation split as an .npz file (default), or the built-in 'digits'")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="Ray searches with 1, then 2 workers, this many times")
    args = parser.parse_args()

    from edgebnn.search import LocalExecutor, SearchSettings, plot_front, run_search

    with tempfile.TemporaryDirectory(prefix="edgebnn-search-bench-") as tmp:
        root = Path(tmp)
        model = args.model
        if model is None:
            t0 = time.perf_counter()
            model = trained_ir(root)
            print(f"trained and imported the digits CNN in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        data = args.data
        if data == "val.npz":
            import numpy as np

            from edgebnn.data import digits

            x, y = digits().split("val")
            np.savez(root / "val.npz", x=x, y=y)
            data = str(root / "val.npz")
        load_before = os.getloadavg()[0]
        settings = SearchSettings(model=str(model), data=data, trials=args.trials, budget=BUDGET, runs=args.runs)
        t0 = time.perf_counter()
        local = run_search(settings, root / "local.jsonl", LocalExecutor(1))
        local_s = time.perf_counter() - t0
        if args.plot:
            plot_front(local, args.plot)
        base = local["baseline"]
        best = local["best"]
        result: dict = {"trials": args.trials, "budget": BUDGET, "data": args.data,
                        "local_1_worker_s": round(local_s, 2),
                        "float_bnn_bytes": base["bytes"], "baseline": base["metrics"],
                        "completed": sum(t["state"] == "complete" for t in local["trials"]),
                        "pareto": [t["number"] for t in local["pareto"]], "best_reason": local["best_reason"]}
        if best is not None:
            result["best"] = {"number": best["number"], "config": best["config"], "bytes": best["bytes"],
                              "ratio_vs_fp32_bnn": round(base["bytes"] / best["bytes"], 2),
                              "ir_bytes": best.get("ir_bytes"), "deployed": best.get("deployed"),
                              "d_nll": round(best["metrics"]["nll"] - base["metrics"]["nll"], 4),
                              "d_ece": round(best["metrics"]["ece"] - base["metrics"]["ece"], 4),
                              "accuracy": best["metrics"]["accuracy"]}
            result["goal_16x_within_budget"] = base["bytes"] / best["bytes"] >= 16
        if not args.skip_ray:
            runs: dict[int, list[dict]] = {1: [], 2: []}
            for _ in range(args.repeat):
                for workers in (1, 2):
                    timing, report = ray_search(settings, root / f"ray{workers}-{len(runs[workers])}.jsonl", workers)
                    timing["same_trials_as_local"] = strip_timing(report) == strip_timing(local)
                    runs[workers].append(timing)
            for workers, timings in runs.items():
                result[f"ray_{workers}_workers"] = timings
            pairs = list(zip(runs[1], runs[2], strict=True))
            result["ray_2_over_1"] = [round(two["search_s"] / one["search_s"], 3) for one, two in pairs]
            result["ray_2_over_1_after_first_batch"] = [
                round(later(two) / later(one), 3) for one, two in pairs]
            result["ray_2_over_1_with_start_and_stop"] = [round(total(two) / total(one), 3) for one, two in pairs]
            result["ray_same_trials_as_local"] = all(t["same_trials_as_local"] for ts in runs.values() for t in ts)
        result["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    line = json.dumps(result)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    for key, value in result.items():
        print(f"{key:>28}: {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
