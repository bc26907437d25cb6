"""A corpus of exports hashed, to show that a refactoring changes no exported byte (issue 30, "behaviour kept").

Small models, every seed fixed, nothing trained by gradient descent (the weights are torch's seeded initial
values; Laplace is fitted on 200 digits images), so the corpus runs in a few minutes on 2 CPU cores:

- families: mean-field VI (edgebnn layers), MC dropout, deep ensemble (3 plain MLPs), Laplace (last layer,
  Kronecker and diagonal, laplace-torch), SWAG (low-rank, statistics drawn from a seeded generator);
- tasks: classification (digits-shaped MLP and CNN), regression (mean + log-variance head; mean head with a stated
  noise variance), per-pixel (segmentation: a small conv net);
- lowerings: none (the imported IR), ``fixed``, ``mcq``, ``codebook``, ``ternary``, ``binary`` (VI), ``fixed``
  (the other families);
- exports: every mode (``baked``, ``noise`` auto and ``--noise weight``, ``shared``, ``analytic``) × every
  ``--weights`` (``ir``, ``fp32``, ``int8``, ``int4``), S = 4 (the deep ensemble: S = M = 3), seed 0; plus the
  int8/int4 forms (folded, integer), ``--hoist auto`` and ``--rng graph`` on a few.

Entries (name -> sha256 hex):

- ``<model>/<lowering>.ebnn``: the saved IR's bytes;
- ``<model>/<lowering>/<mode>/<weights>[/<extra>].onnx``: the exported ONNX bytes with the ``config`` key removed
  from its ``edgebnn.export`` metadata (the export configuration every export records since issue 42, re-dumped as
  ``write_metadata`` writes it: every other byte is compared; that the key is there, and reproduces the export's
  options, is checked separately: a missing or wrong one stops the run), or ``error:`` + the message's hash where
  the export refuses with an ``EdgeBNNError`` (a refusal that changes is a change too; any other exception stops
  the run);
- ``... .out``: the export run by ``Session(seed=0, threads=1)`` on a fixed batch of 4 inputs, every output array
  rounded to 5 decimals (host noise included, so a change of the noise sampler shows here and not in ``.onnx``).

Usage (from the repo root; one JSON object on stdout, a summary on stderr):

    PYTHONPATH=$PWD .venv/bin/python bench/export_corpus.py > corpus.json
    PYTHONPATH=$PWD .venv/bin/python bench/export_corpus.py --check corpus.json   # exit 1 and the list if any differ

``--only SUBSTRING`` keeps the entries whose name contains it (faster checks while working).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import edgebnn
from edgebnn.errors import EdgeBNNError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.exporters.metadata import EXPORT_KEY
from edgebnn.nn import BayesConv2d, BayesLinear
from edgebnn.runtime import Session

SAMPLES = 4
MODES = (("baked", {}), ("noise", {}), ("noise", {"noise": "weight"}), ("shared", {}), ("analytic", {}))
WEIGHTS = ("ir", "fp32", "int8", "int4")
VI_LOWERINGS = ("float", "fixed", "mcq", "codebook", "ternary", "binary")
FAMILY_LOWERINGS = ("float", "fixed")
EXTRAS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (  # (mode, weights, tag, options) on a few models
    ("baked", "int8", "folded", {"form": "folded"}),
    ("baked", "int8", "integer", {"form": "integer"}),
    ("baked", "int4", "integer", {"form": "integer"}),
    ("baked", "fp32", "hoist", {"hoist": "auto"}),
    ("noise", "ir", "hoist", {"hoist": "auto"}),
    ("noise", "ir", "rng-graph", {"rng": "graph"}),
    ("shared", "ir", "rng-graph", {"rng": "graph"}),
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(seed)
    return build().eval()


def _vi_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), BayesLinear(64, 16, init_rho=-3.0), nn.ReLU(),
                         BayesLinear(16, 10, init_rho=-3.0))


def _vi_cnn() -> nn.Module:
    return nn.Sequential(BayesConv2d(1, 4, 3, padding=1, init_rho=-3.0), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), BayesLinear(64, 10, init_rho=-3.0))


def _vi_reg(width: int) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(BayesLinear(3, 8, init_rho=-3.0), nn.ReLU(), BayesLinear(8, width, init_rho=-3.0))


def _vi_seg() -> nn.Module:
    return nn.Sequential(BayesConv2d(1, 4, 3, padding=1, init_rho=-3.0), nn.ReLU(), BayesConv2d(4, 3, 1, init_rho=-3.0))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def _dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 10))


def _dropout_reg() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 2))


def _dropout_seg() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.2), nn.Conv2d(4, 3, 1))


def _laplace(structure: str) -> Any:
    import laplace

    from edgebnn.data import digits

    data = digits(0)
    net = _seeded(0, _mlp)
    x = torch.from_numpy(data.x_train[:200]).float()
    y = torch.from_numpy(data.y_train[:200]).long()
    la = laplace.Laplace(net, "classification", subset_of_weights="last_layer", hessian_structure=structure,
                         prior_precision=1.0)
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=200))
    return edgebnn.from_torch(la, (1, 1, 8, 8), name=f"laplace-{structure}")


def _swag() -> Any:
    net = _seeded(0, _mlp)
    gen = torch.Generator().manual_seed(1)
    stats = {}
    for name, p in net.named_parameters():
        w = p.detach()
        sd = 0.05 * torch.rand(w.shape, generator=gen)
        stats[f"{name}_mean"] = w
        stats[f"{name}_sq_mean"] = w**2 + sd**2
        stats[f"{name}_covariance_sqrt"] = 0.05 * torch.randn((3, w.numel()), generator=gen)
    return edgebnn.from_swag(net, stats, (1, 1, 8, 8), scale=0.5, name="swag")


def models() -> Iterator[tuple[str, Callable[[], Any], tuple[str, ...], bool]]:
    """(name, IR builder, lowerings, whether the extras run on it)."""
    img = (1, 1, 8, 8)
    yield ("vi-mlp", lambda: edgebnn.from_torch(_seeded(0, _vi_mlp), img), VI_LOWERINGS, True)
    yield ("vi-cnn", lambda: edgebnn.from_torch(_seeded(1, _vi_cnn), img), VI_LOWERINGS, True)
    yield ("vi-reg-logvar", lambda: edgebnn.from_torch(_seeded(2, _vi_reg(2)), (1, 3), task="regression",
                                                       regression_head="mean_logvar"), VI_LOWERINGS, True)
    yield ("vi-reg-mean", lambda: edgebnn.from_torch(_seeded(3, _vi_reg(1)), (1, 3), task="regression",
                                                     noise_var=0.05), FAMILY_LOWERINGS, False)
    yield ("vi-seg", lambda: edgebnn.from_torch(_seeded(4, _vi_seg), (1, 1, 6, 6), task="segmentation"),
           VI_LOWERINGS, True)
    yield ("dropout-mlp", lambda: edgebnn.from_torch(_seeded(5, _dropout_mlp), img, mc_dropout=True),
           FAMILY_LOWERINGS, True)
    yield ("dropout-reg", lambda: edgebnn.from_torch(_seeded(6, _dropout_reg), (1, 3), mc_dropout=True,
                                                     task="regression"), FAMILY_LOWERINGS, False)
    yield ("dropout-seg", lambda: edgebnn.from_torch(_seeded(7, _dropout_seg), (1, 1, 6, 6), mc_dropout=True,
                                                     task="segmentation"), FAMILY_LOWERINGS, False)
    yield ("ensemble", lambda: edgebnn.from_torch([_seeded(s, _mlp) for s in range(3)], img),
           FAMILY_LOWERINGS, True)
    yield ("laplace-kron", lambda: _laplace("kron"), FAMILY_LOWERINGS, True)
    yield ("laplace-diag", lambda: _laplace("diag"), FAMILY_LOWERINGS, False)
    yield ("swag", _swag, FAMILY_LOWERINGS, True)


def _without_config(proto: Any, config: ExportConfig) -> bytes:
    """The export's bytes with the ``config`` key dropped from its metadata (re-dumped as ``write_metadata`` does),
    after checking that the key is there and records ``config`` (every field given, ``auto`` decided)."""
    copy = type(proto)()
    copy.CopyFrom(proto)
    (entry,) = [p for p in copy.metadata_props if p.key == EXPORT_KEY]
    record = json.loads(entry.value)
    recorded = record.pop("config", None)
    if recorded is None:
        raise AssertionError("the export metadata records no config")
    given = {k: v for k, v in config.to_dict().items() if v != "auto" and k != "rule"}
    wrong = {k: (v, recorded.get(k)) for k, v in given.items() if recorded.get(k) != v}
    if wrong or ExportConfig.from_dict(recorded).to_dict() != recorded:
        raise AssertionError(f"the recorded config {recorded} does not record the export's options: {wrong}")
    entry.value = json.dumps(record, sort_keys=True)
    return copy.SerializeToString()


def _error(exc: Exception) -> str:
    return "error:" + _sha(f"{type(exc).__name__}: {exc}".encode())


def _outputs(proto: Any, x: np.ndarray) -> str:
    pred = Session(proto, seed=0, threads=1).predict(x)
    h = hashlib.sha256()
    for key, value in sorted(vars(pred).items()):
        if isinstance(value, np.ndarray):
            h.update(key.encode())
            h.update(np.round(value.astype(np.float64), 5).tobytes())
    return h.hexdigest()


def corpus(only: str | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    tmp = Path(tempfile.mkdtemp(prefix="corpus-"))
    for name, build, lowerings, extras in models():
        if only and not any(only in f"{name}/{low}" for low in lowerings) and only not in name:
            continue
        try:
            ir = build()
        except EdgeBNNError as exc:  # a refusal is an entry too; anything else is a bug: it stops the run
            out[f"{name}.import"] = _error(exc)
            continue
        shape = list(ir.manifest.input_shape)
        x = np.random.default_rng(0).standard_normal([4, *shape[1:]]).astype(np.float32)
        samples = 3 if name == "ensemble" else SAMPLES
        for low in lowerings:
            key = f"{name}/{low}"
            if only and "/" in only and only not in key and not only.startswith(key + "/"):
                continue
            try:
                model = ir if low == "float" else edgebnn.lower(ir, low, seed=0)
            except EdgeBNNError as exc:
                out[f"{key}.ebnn"] = _error(exc)
                continue
            path = edgebnn.save(model, tmp / "m.ebnn")
            out[f"{key}.ebnn"] = _sha(path.read_bytes())
            runs = [(mode, w, "/".join(f"{k}-{v}" for k, v in opts.items()), opts)
                    for mode, opts in MODES for w in WEIGHTS]
            if extras and low in ("float", "fixed"):
                runs += [(mode, w, tag, opts) for mode, w, tag, opts in EXTRAS]
            for mode, weights, tag, opts in runs:
                entry = f"{key}/{mode}/{weights}" + (f"/{tag}" if tag else "")
                if only and only not in entry:
                    continue
                config = ExportConfig(samples, mode=mode, weights=weights, seed=0, **{"rng": "host", **opts})
                try:
                    proto = export_model(model, config).proto
                except EdgeBNNError as exc:
                    out[f"{entry}.onnx"] = _error(exc)
                    continue
                out[f"{entry}.onnx"] = _sha(_without_config(proto, config))
                try:
                    out[f"{entry}.out"] = _outputs(proto, x)
                except EdgeBNNError as exc:
                    out[f"{entry}.out"] = _error(exc)
    return out


def diff(saved: dict[str, str], now: dict[str, str]) -> list[str]:
    lines = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if a == b:
            continue
        if a is None:
            lines.append(f"new      {key}")
        elif b is None:
            lines.append(f"missing  {key}")
        else:
            kind = "refused " if b.startswith("error:") and not a.startswith("error:") else (
                "now runs" if a.startswith("error:") and not b.startswith("error:") else "changed ")
            lines.append(f"{kind} {key}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", type=Path, help="a saved corpus JSON: list the entries that differ (exit 1)")
    parser.add_argument("--only", help="keep the entries whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    now = corpus(args.only)
    took = time.perf_counter() - start
    errors = sum(v.startswith("error:") for v in now.values())
    print(f"{len(now)} entries ({errors} refusals) in {took:.0f} s", file=sys.stderr)
    if args.check is None:
        print(json.dumps(now, indent=0, sort_keys=True))
        return 0
    saved = json.loads(args.check.read_text())
    if args.only:
        saved = {k: v for k, v in saved.items() if k in now or args.only in k}
    lines = diff(saved, now)
    for line in lines:
        print(line)
    print(f"{len(lines)} of {len(set(saved) | set(now))} entries differ", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
