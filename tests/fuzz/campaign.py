"""File fuzzing of every command that reads a user file: seeded mutants of valid files, run as a user would.

A campaign builds one valid file per format (``bases``), then for mutant ``i`` of seed ``s`` picks a target
(a command line reading one file, :data:`TARGETS`), mutates that target's file with :func:`mutate.mutate` and
runs the command. The contract a mutant must keep (README, "Bad files"): exit status 0, or 2 with at most
three lines of output ending in ``error: ...`` and nothing written; never a traceback, another exit status, a
signal (a native crash of onnxruntime, numpy or torch underneath) or a hang.

Commands run in worker processes (``python campaign.py --worker``), many per process through click's
``CliRunner`` (fast: no interpreter start per mutant); the parent sends one job at a time to each worker and
waits with a deadline, so a native crash only kills that worker (recorded with its mutant, the worker is
restarted) and a hang is killed and recorded. A failing mutant's bytes are kept under ``--keep`` for a
regression case (``tests/fuzz/regressions``).

    python tests/fuzz/campaign.py --seed 123 --mutants 10000 --keep fuzz-out        # make fuzz (random seed)
    python tests/fuzz/campaign.py --seed 31000 --mutants 1000 --balance --targets ebnn,onnx,npz,safetensors
    python tests/fuzz/campaign.py --seed 31001 --mutants 120 --fresh --targets ebnn,onnx,npz   # a process each
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import os
import random
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
for _p in (HERE, TESTS / "reliability", TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from mutate import mutate  # noqa: E402

HANG_S = 60.0  # the goal: no mutant runs longer
ADDRESS_SPACE = 8 << 30  # a worker trying to allocate a hostile declared size fails loudly, not lazily
MAX_LINES = 1  # the README's promise (the issue allows 3): one line, no warning before it

Argv = Callable[[Path, Path, dict[str, Path]], list[str]]


@dataclasses.dataclass(frozen=True)
class Target:
    """One command reading one user file: ``argv(mutant, job_dir, bases)``; the mutant of ``bases[base]`` is
    written to ``job_dir / file`` (``file`` may be in a folder, beside copies of the base files ``folder``).
    ``weight``: its share of a campaign's mutants."""

    name: str
    base: str
    file: str
    argv: Argv
    weight: int = 1
    torch: bool = False
    codes: tuple[int, ...] = (0, 2)  # compare exits 1 when the distributions differ, 3 when it cannot tell (documented)
    folder: tuple[str, ...] = ()  # other base files copied beside the mutant (shards)

    @property
    def format(self) -> str:
        return self.name.split("-")[0]


def _eval_data(m: Path, d: Path, b: dict[str, Path]) -> list[str]:
    return ["eval", str(b["model.onnx"]), "--data", str(m)]


TINY = ["--model", "fuzz_factories:tiny", "--input-shape", "1,1,8,8"]

TARGETS: list[Target] = [
    # .ebnn: the IR (archive = protobuf, manifest JSON, tensors)
    Target("ebnn-inspect", "model.ebnn", "m.ebnn", lambda m, d, b: ["inspect", str(m), "--json"], 2),
    Target("ebnn-inspect-fixed", "fixed.ebnn", "m.ebnn", lambda m, d, b: ["inspect", str(m), "--json"], 2),
    Target("ebnn-export", "model.ebnn", "m.ebnn",
           lambda m, d, b: ["export", str(m), "-S", "2", "-o", str(d / "o.onnx")], 2),
    Target("ebnn-export-fixed-noise", "fixed.ebnn", "m.ebnn",
           lambda m, d, b: ["export", str(m), "-S", "2", "--mode", "noise", "-o", str(d / "o.onnx")], 2),
    Target("ebnn-eval", "model.ebnn", "m.ebnn",
           lambda m, d, b: ["eval", str(m), "-S", "2", "--data", str(b["data.npz"]), "--json", str(d / "e.json")], 2),
    Target("ebnn-compare", "model.ebnn", "m.ebnn",
           lambda m, d, b: ["compare", str(m), str(b["model.ebnn"]), "-S", "2", "--null-runs", "19", "--alpha", "0.05",
                            "--data", str(b["data.npz"])], codes=(0, 1, 2, 3)),
    Target("ebnn-profile", "model.ebnn", "m.ebnn",
           lambda m, d, b: ["profile", str(m), "-S", "2", "--runs", "2", "--warmup", "0", "--power-meter", "none",
                            "--json", str(d / "p.json")]),
    Target("ebnn-lower-config", "fixed.ebnn", "m.ebnn",
           lambda m, d, b: ["lower", *TINY, "--weights", str(b["tiny.safetensors"]), "--config", str(m),
                            "-o", str(d / "o.ebnn")], torch=True),
    # .onnx: an export (metadata JSON, initializers, external data)
    Target("onnx-inspect", "model.onnx", "m.onnx", lambda m, d, b: ["inspect", str(m), "--json"], 2),
    Target("onnx-eval", "model.onnx", "m.onnx",
           lambda m, d, b: ["eval", str(m), "--data", str(b["data.npz"]), "--json", str(d / "e.json")], 3),
    Target("onnx-eval-noise", "noise.onnx", "m.onnx", lambda m, d, b: ["eval", str(m), "--data", str(b["data.npz"])],
           2),
    Target("onnx-calibrate", "model.onnx", "m.onnx",
           lambda m, d, b: ["calibrate", str(m), "--data", str(b["data.npz"]), "--method", "minmax",
                            "-o", str(d / "q.onnx")]),
    Target("onnx-compare", "model.onnx", "m.onnx",
           lambda m, d, b: ["compare", str(m), str(b["model.ebnn"]), "-S", "2", "--null-runs", "19", "--alpha", "0.05",
                            "--data", str(b["data.npz"])], codes=(0, 1, 2, 3)),
    Target("onnx-profile", "model.onnx", "m.onnx",
           lambda m, d, b: ["profile", str(b["model.ebnn"]), "--onnx", str(m), "-S", "2", "--runs", "2",
                            "--warmup", "0", "--power-meter", "none"]),
    # .npz / .npy: the user's data
    Target("npz-eval", "data.npz", "d.npz", _eval_data, 3),
    Target("npz-eval-compressed", "data_compressed.npz", "d.npz", _eval_data, 3),
    Target("npz-eval-ood", "data_compressed.npz", "ood.npz",
           lambda m, d, b: ["eval", str(b["model.onnx"]), "--data", str(b["data.npz"]), "--ood-data", str(m)], 2),
    Target("npz-calibrate", "data_compressed.npz", "d.npz",
           lambda m, d, b: ["calibrate", str(b["model.onnx"]), "--data", str(m), "--method", "minmax",
                            "-o", str(d / "q.onnx")]),
    Target("npz-compare", "data.npz", "d.npz",
           lambda m, d, b: ["compare", str(b["model.ebnn"]), str(b["model.onnx"]), "--null-runs", "19",
                            "--alpha", "0.05", "--data", str(m)], codes=(0, 1, 2, 3)),
    Target("npy-shard-x", "x_000.npy", "shards/x_000.npy",
           lambda m, d, b: ["eval", str(b["model.onnx"]), "--data", str(m.parent)], 2, folder=("y_000.npy",)),
    Target("npy-shard-y", "y_000.npy", "shards/y_000.npy",
           lambda m, d, b: ["eval", str(b["model.onnx"]), "--data", str(m.parent)], folder=("x_000.npy",)),
    # weights: .safetensors and .pt
    Target("safetensors-lower", "tiny.safetensors", "w.safetensors",
           lambda m, d, b: ["lower", *TINY, "--weights", str(m), "-o", str(d / "o.ebnn")], 2, torch=True),
    Target("pt-lower", "tiny.pt", "w.pt",
           lambda m, d, b: ["lower", *TINY, "--weights", str(m), "-o", str(d / "o.ebnn")], torch=True),
    Target("laplace-lower", "laplace.pt", "la.pt",
           lambda m, d, b: ["lower", "--model", "fuzz_factories:plain", "--input-shape", "1,1,8,8", "--weights",
                            str(b["plain.safetensors"]), "--laplace", str(m), "-o", str(d / "o.ebnn")], torch=True),
    # JSON inputs: --config, --bench-results
    Target("json-lower-config", "config.json", "c.json",
           lambda m, d, b: ["lower", *TINY, "--weights", str(b["tiny.safetensors"]), "--config", str(m),
                            "-o", str(d / "o.ebnn")], torch=True),
    Target("json-bench-results", "bench.json", "b.json",
           lambda m, d, b: ["profile", str(b["model.ebnn"]), "-S", "2", "--runs", "2", "--warmup", "0",
                            "--power-meter", "none", "--bench-results", str(m)]),
]
FORMATS = ("ebnn", "onnx", "npz", "safetensors")


def targets(names: str | None = None, torch: bool = True, bases: dict[str, Path] | None = None) -> list[Target]:
    """The targets whose name starts with one of the comma-separated prefixes ``names`` (all by default), those
    that need torch only with ``torch``, and only those whose base file exists in ``bases``."""
    prefixes = tuple(names.split(",")) if names else ("",)
    return [t for t in TARGETS if t.name.startswith(prefixes) and (torch or not t.torch)
            and (bases is None or t.base in bases)]


# -- the valid files ----------------------------------------------------------------------------------------


def build_bases(out: Path, torch: bool = True, laplace: bool = True) -> dict[str, Path]:
    """One valid file per format in ``out`` (small: the lane mutates each many times); the laplace-torch state
    only with ``laplace`` (importing laplace-torch and fitting takes seconds)."""
    import numpy as np
    from hostile import digits_shaped

    from edgebnn import ir
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.ensemble import save_onnx
    from edgebnn.exporters.export import export_model
    from edgebnn.passes import LowerConfig, lower

    out.mkdir(parents=True, exist_ok=True)
    b: dict[str, Path] = {}
    model = digits_shaped()
    b["model.ebnn"] = ir.save(model, out / "model.ebnn")
    b["fixed.ebnn"] = ir.save(lower(digits_shaped(), "fixed").model, out / "fixed.ebnn")
    b["model.onnx"] = save_onnx(export_model(model, ExportConfig(2, mode="baked")).proto, out / "model.onnx")
    b["noise.onnx"] = save_onnx(export_model(model, ExportConfig(2, mode="noise", rng="host")).proto,
                                out / "noise.onnx")
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (12, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 12)
    np.savez(out / "data.npz", x=x, y=y)
    np.savez_compressed(out / "data_compressed.npz", x=x, y=y)
    b["data.npz"], b["data_compressed.npz"] = out / "data.npz", out / "data_compressed.npz"
    np.save(out / "x_000.npy", x)
    np.save(out / "y_000.npy", y)
    b["x_000.npy"], b["y_000.npy"] = out / "x_000.npy", out / "y_000.npy"
    b["config.json"] = out / "config.json"
    b["config.json"].write_text(LowerConfig.from_dict({"scheme": "fixed", "bits": 4, "seed": 1}).to_json())
    b["bench.json"] = out / "bench.json"
    b["bench.json"].write_text(json.dumps({"device": "cpu", "cells": [
        {"samples": 2, "batch": 1, "modes": {"baked": {"latency_ms": {"p50": 0.5}},
                                             "analytic": {"latency_ms": {"p50": 0.2}}}}]}))
    if torch:
        import torch as th
        from fuzz_factories import tiny
        from safetensors.torch import save_file

        th.manual_seed(0)
        state = {k: v.contiguous() for k, v in tiny().state_dict().items()}
        save_file(state, str(out / "tiny.safetensors"))
        th.save(state, str(out / "tiny.pt"))
        b["tiny.safetensors"], b["tiny.pt"] = out / "tiny.safetensors", out / "tiny.pt"
        if laplace and importlib.util.find_spec("laplace") is not None:
            import laplace
            from fuzz_factories import plain

            net = plain()
            save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(out / "plain.safetensors"))
            data = th.utils.data.TensorDataset(th.from_numpy(x), th.from_numpy(y))
            la = laplace.Laplace(net, "classification", subset_of_weights="last_layer", hessian_structure="diag",
                                 prior_precision=1.0)
            la.fit(th.utils.data.DataLoader(data, batch_size=12))
            th.save(la.state_dict(), str(out / "laplace.pt"))
            b["plain.safetensors"], b["laplace.pt"] = out / "plain.safetensors", out / "laplace.pt"
    return b


# -- the worker: runs commands in-process, one JSON line per job --------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def run_job(argv: list[str], job_dir: Path) -> dict[str, Any]:
    """Run ``edgebnn ARGV`` in this process; the result a campaign judges."""
    import traceback

    from click.testing import CliRunner

    from edgebnn.cli import main

    before = _snapshot(job_dir)
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, argv, catch_exceptions=True)
    seconds = time.perf_counter() - t0
    tb = None
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else repr(result.exception)
    return {"code": result.exit_code, "stderr": result.stderr, "stdout_tail": result.stdout[-400:],
            "traceback": tb, "seconds": seconds, "changed": _snapshot(job_dir) != before}


def _share_torch_onnx_registry() -> None:
    """Build torch.onnx's op registry once per worker instead of on every export (3-4 s of the 4-6 s a ``lower``
    of the tiny model takes): the fuzz harness's own speed-up; the registry is the same either way, edgebnn
    registers no custom ops. Skipped where torch is absent or its internals moved."""
    if importlib.util.find_spec("torch") is None:
        return
    try:
        from torch.onnx._internal.exporter import _registration
        build = _registration.ONNXRegistry.from_torchlib.__func__
    except (ImportError, AttributeError):
        return
    built: dict[Any, Any] = {}

    def from_torchlib(cls: Any, *args: Any, **kwargs: Any) -> Any:
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = build(cls, *args, **kwargs)
        return built[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)


def worker() -> None:
    """Read jobs ``{"argv": [...], "dir": ...}`` from stdin, answer each with one JSON line on stdout."""
    import warnings

    _share_torch_onnx_registry()
    warnings.simplefilter("default")  # what a user's shell shows: a warning counts as a line of output
    out = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray native prints must not corrupt the protocol
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        out.write(json.dumps(run_job(job["argv"], Path(job["dir"]))) + "\n")
        out.flush()


# -- the parent: workers, deadlines, verdicts ---------------------------------------------------------------


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


class Worker:
    """A ``campaign.py --worker`` process; restarted after a crash or a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
        env.pop("PYTHONWARNINGS", None)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=_cap_memory, cwd=str(HERE))
        ready = self._read(300.0)
        if not isinstance(ready, dict) or not ready.get("ready"):
            raise RuntimeError(f"fuzz worker did not start: {ready}")

    def _read(self, timeout: float) -> dict[str, Any] | str:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return "hang"
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            return f"signal {-self.proc.returncode}" if self.proc.returncode < 0 else f"died {self.proc.returncode}"
        return json.loads(line)

    def run(self, argv: list[str], job_dir: Path, timeout: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps({"argv": argv, "dir": str(job_dir)}) + "\n")
            self.proc.stdin.flush()
            got = self._read(timeout)
        except BrokenPipeError:
            self.proc.wait()
            got = f"signal {-self.proc.returncode}" if self.proc.returncode < 0 else f"died {self.proc.returncode}"
        if isinstance(got, dict):
            return got
        stderr = ""
        if got == "hang":
            self.stop()
        else:
            assert self.proc.stderr is not None
            stderr = self.proc.stderr.read()[-2000:]
        self.proc = None
        return {"code": None, "crash": got, "stderr": stderr, "traceback": None, "seconds": time.perf_counter() - t0,
                "changed": False}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class FreshProcess(Worker):
    """Each job in a new ``python -m edgebnn`` process, exactly what a user's shell sees (slower: an interpreter
    and its imports per mutant). Cross-checks the in-process workers: warnings printed once per process, output at
    exit, anything CliRunner would hide."""

    def run(self, argv: list[str], job_dir: Path, timeout: float) -> dict[str, Any]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
        env.pop("PYTHONWARNINGS", None)
        before = _snapshot(job_dir)
        t0 = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-m", "edgebnn", *argv], capture_output=True, text=True, env=env,
                               preexec_fn=_cap_memory, cwd=str(HERE), timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"code": None, "crash": "hang", "stderr": "", "traceback": None,
                    "seconds": time.perf_counter() - t0, "changed": False}
        crash = f"signal {-r.returncode}" if r.returncode < 0 else None
        return {"code": r.returncode, "crash": crash, "stderr": r.stderr, "stdout_tail": r.stdout[-400:],
                "traceback": None, "seconds": time.perf_counter() - t0, "changed": _snapshot(job_dir) != before}

    def stop(self) -> None:
        pass


def verdict(target: Target, result: dict[str, Any]) -> str:
    """``ok`` (exit 0 or a documented status), ``exit2`` (a clean refusal), or what went wrong."""
    if result.get("crash"):
        return "hang" if result["crash"] == "hang" else "signal" if result["crash"].startswith("signal") else "died"
    if result["traceback"] or "Traceback (most recent call last)" in result["stderr"]:
        return "traceback"
    code = result["code"]
    if code not in target.codes:
        return f"exit{code}"
    if code == 2:
        lines = (result["stdout_tail"] + result["stderr"]).strip().splitlines()
        if not lines or len(lines) > MAX_LINES or not lines[-1].startswith("error: "):
            return "long-message"
        if result["changed"]:
            return "wrote-on-error"
        return "exit2"
    return "ok"


@dataclasses.dataclass
class Mutant:
    index: int
    target: Target
    description: str
    data: bytes
    seed: int | None = None  # None: not generated (a regression file)


def mutants(seed: int, count: int, chosen: list[Target], bases: dict[str, Path], balance: bool = False,
            ) -> Iterator[Mutant]:
    """``count`` mutants of seed ``seed``, targets drawn by weight (the same list for the same arguments); with
    ``balance``, each format (a target name's first word) gets the same share, split by weight among its targets."""
    pick = random.Random(f"edgebnn-fuzz-targets/{seed}")
    weights = [float(t.weight) for t in chosen]
    if balance:
        total = Counter[str]()
        for t in chosen:
            total[t.format] += t.weight
        weights = [t.weight / total[t.format] for t in chosen]
    for i in range(count):
        t = pick.choices(chosen, weights)[0]
        yield _mutant(t, seed, i, bases)


def quota_mutants(seed: int, quota: dict[str, int], bases: dict[str, Path]) -> Iterator[Mutant]:
    """``quota[name]`` mutants of each target in turn (a lane that covers every target, whatever the seed).

    The torch targets' mutants change only the files' first and last 512 bytes, where their loaders parse
    (safetensors' JSON header, a .pt's zip directory and pickle): a mutant whose float data changed loads and
    then spends seconds in torch.onnx.export, which a lane cannot afford and ``make fuzz`` covers.
    """
    i = 0
    for t in targets(bases=bases):
        for _ in range(quota.get(t.name, 0)):
            yield _mutant(t, seed, i, bases, edges=t.torch)
            i += 1


def _mutant(t: Target, seed: int, index: int, bases: dict[str, Path], edges: bool = False) -> Mutant:
    data, desc = mutate(bases[t.base].read_bytes(), seed, index, edges=edges)
    return Mutant(index, t, desc, data, seed)


def target_of(path: Path) -> Target:
    """The target a kept mutant file ``TARGET-sSEED-iINDEX.EXT`` (or ``TARGET-NOTE.EXT``) belongs to."""
    found = [t for t in TARGETS if path.name.startswith(f"{t.name}-")]
    if not found:
        raise ValueError(f"{path.name}: names no fuzz target")
    return max(found, key=lambda t: len(t.name))  # ebnn-inspect-fixed-..., not ebnn-inspect


def stage(m: Mutant, job_dir: Path, bases: dict[str, Path]) -> Path:
    """Write the mutant (and the files beside it) into a fresh ``job_dir``; return the mutant's path."""
    if job_dir.exists():
        shutil.rmtree(job_dir)
    path = job_dir / m.target.file
    path.parent.mkdir(parents=True)
    path.write_bytes(m.data)
    for other in m.target.folder:
        shutil.copyfile(bases[other], path.parent / other)
    return path


def run_campaign(seed: int, count: int, *, workers: int = 1, names: str | None = None, torch: bool = True,
                 balance: bool = False, quota: dict[str, int] | None = None, extra: list[Path] = (),
                 timeout: float = HANG_S, keep: Path | None = None, work: Path | None = None, fresh: bool = False,
                 log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run mutants on ``workers`` worker processes; the summary (counts, failures, rate).

    The mutants: ``count`` of seed ``seed`` drawn by target weight, or ``quota`` per target; then the files
    ``extra`` (regression cases, each run on the target its name gives).
    """
    tmp = Path(tempfile.mkdtemp(prefix="edgebnn-fuzz-", dir=work))
    try:
        wanted = targets(names, torch=torch) if quota is None else [t for t in TARGETS if quota.get(t.name)]
        bases = build_bases(tmp / "bases", torch=torch, laplace=any(t.base == "laplace.pt" for t in wanted))
        generated = (quota_mutants(seed, quota, bases) if quota is not None
                     else mutants(seed, count, targets(names, torch=torch, bases=bases), bases, balance))
        replays = (Mutant(-1, target_of(p), p.name, p.read_bytes()) for p in extra
                   if target_of(p).base in bases)
        summary = _run(itertools.chain(generated, replays), bases, tmp, seed, workers, timeout, keep, log, fresh)
        return {"targets": [t.name for t in targets(names, torch=torch, bases=bases)], **summary}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(jobs: Iterator[Mutant], bases: dict[str, Path], tmp: Path, seed: int, workers: int, timeout: float,
         keep: Path | None, log: Callable[[str], None] | None, fresh: bool = False) -> dict[str, Any]:
    import concurrent.futures as cf

    pool = [FreshProcess() if fresh else Worker() for _ in range(workers)]
    counts: Counter[str] = Counter()
    by_target: dict[str, Counter[str]] = {}
    failures: list[dict[str, Any]] = []
    slowest: dict[str, Any] = {"seconds": 0.0}
    most_lines = 0  # of an exit-2 message (stdout and stderr)
    longest: dict[str, Any] = {}
    spent: Counter[str] = Counter()
    t0 = time.perf_counter()

    def one(slot: int, m: Mutant) -> tuple[Mutant, dict[str, Any]]:
        job_dir = tmp / f"job{slot}"
        path = stage(m, job_dir, bases)
        argv = m.target.argv(path, job_dir, bases)
        result = pool[slot].run(argv, job_dir, timeout)
        result["argv"] = argv
        return m, result

    # One job per worker at a time, each worker driven from its own thread: a slow job does not stall the others.
    free = list(range(workers))
    done = 0
    try:
        with cf.ThreadPoolExecutor(workers) as ex:
            pending: dict[cf.Future[tuple[Mutant, dict[str, Any]]], int] = {}
            while True:
                while free:
                    m = next(jobs, None)
                    if m is None:
                        break
                    slot = free.pop()
                    pending[ex.submit(one, slot, m)] = slot
                if not pending:
                    break
                finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in finished:
                    free.append(pending.pop(fut))
                    m, result = fut.result()
                    v = verdict(m.target, result)
                    counts[v] += 1
                    by_target.setdefault(m.target.name, Counter())[v] += 1
                    spent[m.target.name] += result["seconds"]
                    if result.get("code") == 2:
                        text = result.get("stdout_tail", "") + result["stderr"]
                        if len(text.strip().splitlines()) > most_lines:
                            most_lines = len(text.strip().splitlines())
                            longest = {"target": m.target.name, "index": m.index, "text": text.strip()[-2000:]}
                    if result["seconds"] > slowest["seconds"]:
                        slowest = {"seconds": round(result["seconds"], 2), "target": m.target.name, "index": m.index}
                    done += 1
                    if v not in ("ok", "exit2"):
                        failures.append(_failure(m, v, result, keep))
                        if log:
                            log(f"[{m.index}] {m.target.name}: {v} ({m.description})")
                    if log and done % 100 == 0:
                        log(f"{done} mutants, {time.perf_counter() - t0:.0f} s: {dict(counts)}")
    finally:
        for w in pool:
            w.stop()
    wall = time.perf_counter() - t0
    return {"seed": seed, "mutants": done, "workers": workers, "wall_s": round(wall, 1),
            "mutants_per_s": round(done / wall, 2) if wall else None, "counts": dict(counts),
            "by_target": {k: dict(v) for k, v in sorted(by_target.items())},
            "by_format": _by_format(by_target), "slowest": slowest,
            "most_lines_on_exit2": most_lines, "longest_exit2": longest,
            "seconds_by_target": {k: round(v, 2) for k, v in spent.most_common()},
            "failures": failures}


def _by_format(by_target: dict[str, Counter[str]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for name, c in by_target.items():
        out[next(t for t in TARGETS if t.name == name).format] += sum(c.values())
    return dict(out)


def _failure(m: Mutant, v: str, result: dict[str, Any], keep: Path | None) -> dict[str, Any]:
    rec = {"verdict": v, "target": m.target.name, "seed": m.seed, "index": m.index, "mutation": m.description,
           "argv": result.get("argv"), "code": result.get("code"), "crash": result.get("crash"),
           "stderr": result["stderr"][-1500:], "traceback": (result.get("traceback") or "")[-3000:]}
    if keep is not None and m.seed is not None:
        keep.mkdir(parents=True, exist_ok=True)
        name = f"{m.target.name}-s{m.seed}-i{m.index}{Path(m.target.file).suffix}"
        (keep / name).write_bytes(m.data)
        rec["kept"] = str(keep / name)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=None, help="campaign seed (default: random, printed)")
    p.add_argument("--mutants", type=int, default=1000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: one per CPU)")
    p.add_argument("--targets", default=None, help="comma-separated target name prefixes (default: all)")
    p.add_argument("--balance", action="store_true", help="the same share of mutants for each format")
    p.add_argument("--fresh", action="store_true", help="one new python -m edgebnn process per mutant (slow, exact)")
    p.add_argument("--no-torch", action="store_true", help="skip the lower targets (they need torch)")
    p.add_argument("--timeout", type=float, default=HANG_S, help="seconds before a mutant counts as a hang")
    p.add_argument("--keep", type=Path, default=None, help="folder for the failing mutants' bytes")
    p.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = p.parse_args(argv)
    if args.worker:
        worker()
        return 0
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    torch = not args.no_torch and importlib.util.find_spec("torch") is not None
    print(f"edgebnn fuzz: seed {seed}, {args.mutants} mutants, {args.workers} workers", flush=True)
    summary = run_campaign(seed, args.mutants, workers=args.workers, names=args.targets, torch=torch,
                           balance=args.balance, timeout=args.timeout, keep=args.keep, fresh=args.fresh,
                           log=lambda s: print(s, flush=True))
    text = json.dumps(summary, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}))
    for f in summary["failures"]:
        last = (f["traceback"] or f["stderr"] or f["crash"] or "(no output)").strip().splitlines()[-1:]
        print(f"FAIL {f['verdict']} {f['target']} seed={f['seed']} index={f['index']} ({f['mutation']}): "
              f"{' '.join(last)}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
