"""The posterior families on the command line (issue 21, items 2 and 4): ``lower --budget`` and ``search`` on a deep
ensemble, and ``lower --laplace STATE`` for a laplace-torch posterior.

- ``--budget`` on 3 digits MLPs searches the bits of each layer's one member grid (``fixed``, float as fallback),
  judged on the ensemble's exported predictive (``baked``, S = M): the export of the chosen ``.ebnn`` and of the
  float one, run in onnxruntime, reproduce the report's figures and keep the budget;
- ``search`` on the float ensemble runs every trial at S = M, ``baked``, without σ codes, and writes a valid
  ``edgebnn.search/2`` report whose best artifact is the trial's;
- ``--laplace STATE`` (``torch.save(la.state_dict(), STATE)``) gives the IR ``edgebnn.from_torch(la, ...)`` gives: the
  same exported predictive; a state of another network, a regression posterior or a pickled object is one line.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import edgebnn
from edgebnn.cli import main

torch = pytest.importorskip("torch")
nn = torch.nn
M = 3
SHAPE = "1,1,8,8"
ENS, MAP = "ens.safetensors", "map.safetensors"  # the members (k.-prefixed keys), member 0 alone (Laplace's MAP)
ROUNDOFF = 1e-5  # the same float32 graph run twice, or the reference's formulas in another op order

FACTORIES = (
    "from torch import nn\n\n"
    "def mlp():\n"
    "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))\n\n"
    f"def ensemble():\n    return [mlp() for _ in range({M})]\n"
)


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    """A module of factories on sys.path (the CLI's --model finds it), and its folder."""
    root = tmp_path_factory.mktemp("families")
    (root / "family_factories.py").write_text(FACTORIES)
    sys.path.insert(0, str(root))
    sys.modules.pop("family_factories", None)
    import family_factories

    yield root, family_factories
    sys.path.remove(str(root))
    sys.modules.pop("family_factories", None)


@pytest.fixture(scope="module")
def trained(factories, digits_mlps):
    """The session's M digits MLPs (conftest; the factories' architecture) saved as one ensemble file (member k's
    keys "k."), member 0 alone too."""
    root, _ = factories
    _save(nn.ModuleList(digits_mlps), root / ENS)
    _save(digits_mlps[0], root / MAP)
    return root, digits_mlps


def _save(module: Any, path: Any) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path))


def _invoke(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


def _lower(root: Any, factory: str, weights: str, out: Any, *extra: Any) -> Any:
    return _invoke("lower", "--model", f"family_factories:{factory}", "--weights", root / weights, "--input-shape",
                   SHAPE, "-o", out, *extra)


def _eval(onnx: Any) -> dict[str, Any]:
    from edgebnn.api import evaluate_artifact

    return evaluate_artifact(str(onnx), data="digits", split="val")


def test_budget_on_a_deep_ensemble_keeps_it_on_the_exported_predictive(trained, tmp_path):
    root, _ = trained
    out, report = tmp_path / "e.ebnn", tmp_path / "e.json"
    r = _lower(root, "ensemble", ENS, out, "--eval", "digits", "--budget", "nll=+0.02,ece=+0.01",
               "--report", report)
    assert r.exit_code == 0, r.output
    body = json.loads(report.read_text())
    budget = body["budget"]
    assert budget["met"] and budget["measured_on"]["samples"] == M
    for row in budget["layers"]:  # bits per layer, fixed on the members' grid (float only as a fallback)
        assert row["scheme"] in ("fixed", "float") and isinstance(row["bits"], int), row
    assert {row["scheme"] for row in budget["layers"]} == {"fixed"}, budget["layers"]
    assert max(row["bits"] for row in budget["layers"]) < 8  # the search went below the variance rule's widths
    assert body["total_bytes"] < body["float_bnn_bytes"] / 4  # at most 8 of 32 bits per member weight
    assert budget["sizes"]["export"]["samples"] == M  # the deployed figure is the S = M export
    # The exported ensembles (baked, S = M by default) reproduce the report's figures, so the budget holds on them.
    float_ir = tmp_path / "f.ebnn"
    assert _lower(root, "ensemble", ENS, float_ir).exit_code == 0
    figures = {}
    for name, ir in (("float_bnn", float_ir), ("lowered", out)):
        onnx = tmp_path / f"{name}.onnx"
        r = _invoke("export", ir, "-o", onnx)
        assert r.exit_code == 0 and f"S={M}" in r.output, r.output
        figures[name] = _eval(onnx)
        for k in ("accuracy", "nll", "ece", "brier"):
            assert figures[name][k] == pytest.approx(body["eval"][name][k], abs=ROUNDOFF), (name, k)
    assert figures["lowered"]["nll"] - figures["float_bnn"]["nll"] <= 0.02 + ROUNDOFF
    assert figures["lowered"]["ece"] - figures["float_bnn"]["ece"] <= 0.01 + ROUNDOFF


def test_search_on_a_deep_ensemble_varies_what_varies_for_it(trained, tmp_path):
    pytest.importorskip("optuna")
    root, _ = trained
    model = tmp_path / "f.ebnn"
    assert _lower(root, "ensemble", ENS, model).exit_code == 0
    out, best = tmp_path / "s.json", tmp_path / "best.onnx"
    r = _invoke("search", model, "--data", "digits", "--trials", 4, "--population", 2, "--runs", 1, "--warmup", 0,
                "--budget", "nll=+0.1", "--json", out, "--export-best", best)
    assert r.exit_code == 0, r.output
    body = json.loads(out.read_text())
    assert body["schema"] == "edgebnn.search/2" and body["edgebnn_version"]
    space = body["settings"]["space"]
    assert (space["family"], space["samples"], space["modes"]) == ("deep ensemble", [M], ["baked"])
    assert space["weights"] == ["ir", "fp32", "int8", "int4"]  # the device's formats and the member-code store
    assert body["baseline"]["samples"] == M and len(body["trials"]) == 4
    for t in body["trials"]:
        c = t["config"]
        assert t["state"] == "complete", t["error"]
        assert (c["samples"], c["mode"], c["sigma_bits"]) == (M, "baked", None) and c["scheme"] in ("fixed", "float")
        assert c["weights"] in space["weights"] and t["bytes"] > 0 and t["latency_ms"] > 0
    chosen = body["best"]
    if chosen.get("source") == "chain":  # lower --budget's data-free chain certified the smallest: its default export
        assert chosen["number"] is None and chosen["samples"] == M
        assert best.stat().st_size == chosen["bytes"], (best.stat().st_size, chosen)
        return _search_refuses_a_sample_count_the_ensemble_lacks(model, tmp_path)
    from edgebnn.search.trial import open_inputs

    # the best artifact is the trial's: same graph, same metrics on the rows the trials are measured on (with a
    # budget: half the validation split, at random; the other half certifies it)
    _, rows, _ = open_inputs(str(model), "digits", None, (0.5, 0, 4000))
    from edgebnn.api import evaluate_artifact

    ev = evaluate_artifact(str(best), data=rows)
    for k in ("accuracy", "nll", "ece", "brier"):
        assert ev[k] == pytest.approx(chosen["metrics"][k], rel=1e-6, abs=1e-9)
    _search_refuses_a_sample_count_the_ensemble_lacks(model, tmp_path)


def _search_refuses_a_sample_count_the_ensemble_lacks(model, tmp_path) -> None:
    r = _invoke("search", model, "--data", "digits", "--samples", "4,8", "--study", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"exports exactly with S = {M} only" in r.output and not (tmp_path / "x.jsonl").exists()


# -- Laplace --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def laplace_states(trained, digits_data, laplace_kron_ll, laplace_diag_all):
    """laplace-torch posteriors of member 0 (the MAP network; the session's fits), each saved as
    torch.save(la.state_dict())."""
    laplace = pytest.importorskip("laplace")
    root, members = trained
    x = torch.from_numpy(digits_data.x_train[:64])
    out = {}
    for (weights, structure), la in ((("last_layer", "kron"), laplace_kron_ll), (("all", "diag"), laplace_diag_all)):
        path = root / f"la_{weights}_{structure}.pt"
        torch.save(la.state_dict(), path)
        out[weights, structure] = la, path
    reg = laplace.Laplace(copy.deepcopy(members[1]), "regression", subset_of_weights="last_layer",
                          hessian_structure="kron")
    reg.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.randn(64, 10)), batch_size=64))
    torch.save(reg.state_dict(), root / "la_regression.pt")
    torch.save({**reg.state_dict(), "extra": nn.Linear(2, 2)}, root / "la_pickled.pt")  # a pickled module inside
    return out


@pytest.mark.parametrize("which", [("last_layer", "kron"), ("all", "diag")])
def test_laplace_from_the_cli_is_the_python_apis_posterior(trained, laplace_states, tmp_path, digits_data, which):
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    root, members = trained
    la, state = laplace_states[which]
    out = tmp_path / "la.ebnn"
    r = _lower(root, "mlp", MAP, out, "--laplace", state)
    assert r.exit_code == 0, r.output
    onnx = tmp_path / "la.onnx"
    assert _invoke("export", out, "-S", 16, "--mode", "baked", "-o", onnx).exit_code == 0
    x = digits_data.x_test[:50]
    cli = edgebnn.Session(str(onnx)).predict(x).probs
    baked = export_model(edgebnn.from_torch(la, (1, 1, 8, 8)), ExportConfig(16, mode="baked")).proto
    api = edgebnn.Session(baked).predict(x).probs
    np.testing.assert_allclose(cli, api, atol=ROUNDOFF)  # the same posterior, the same 16 draws (seed 0)
    with torch.no_grad():
        map_probs = torch.softmax(members[0](torch.from_numpy(x)), -1).numpy()
    assert np.abs(cli - map_probs).max() > 0.01  # not vacuous: the posterior's draws move the predictive off the MAP
    assert edgebnn.load(str(out)).manifest.source_library == "laplace-torch"


def test_laplace_states_edgebnn_cannot_import_are_one_line(trained, laplace_states, tmp_path, factories):
    root, _ = trained
    full = torch.load(root / "la_all_diag.pt", weights_only=True)
    torch.save({**full, "cls_name": "FullLaplace"}, tmp_path / "full.pt")  # a structure edgebnn does not import
    torch.save([1, 2], tmp_path / "list.pt")
    other = tmp_path / "other_factories.py"
    other.write_text("from torch import nn\n\ndef wide():\n"
                     "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 10))\n")
    cases = [((MAP, root / "la_regression.pt"), "likelihood 'regression'; edgebnn imports classification"),
             ((MAP, root / "la_pickled.pt"), "refused: the checkpoint holds pickled objects"),
             ((MAP, root / MAP), "not a laplace-torch state_dict"),
             ((ENS, root / "la_all_diag.pt"), "does not match the model"),
             ((MAP, tmp_path / "full.pt"), "a FullLaplace: edgebnn imports DiagLaplace"),
             ((MAP, tmp_path / "list.pt"), "not a laplace-torch state_dict")]
    for (weights, state), needle in cases:
        r = _lower(root, "mlp", weights, tmp_path / "bad.ebnn", "--laplace", state)
        assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    # a state of another network: the wide MLP's posterior has more parameters than the saved one
    sys.path.insert(0, str(tmp_path))
    try:
        import other_factories

        _save(other_factories.wide(), tmp_path / "w.safetensors")
        for state in ("la_last_layer_kron.pt", "la_all_diag.pt"):
            r = _invoke("lower", "--model", "other_factories:wide", "--weights", tmp_path / "w.safetensors",
                        "--input-shape", SHAPE, "-o", tmp_path / "bad.ebnn", "--laplace", root / state)
            assert r.exit_code == 2 and "does not fit other_factories:wide" in r.output, r.output
            assert len(r.output.strip().splitlines()) == 1, r.output
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("other_factories", None)
    r = _lower(root, "mlp", MAP, tmp_path / "bad.ebnn", "--laplace", root / "la_all_diag.pt", "--mc-dropout")
    assert r.exit_code == 2 and "drop --mc-dropout" in r.output, r.output
    assert not (tmp_path / "bad.ebnn").exists()


def test_a_damped_kron_state_imports_the_posterior_laplace_torch_samples(trained, tmp_path, digits_data):
    """laplace-torch 0.3's state does not record KronLaplace(damping=True), and its posterior precision (a sum of
    KronDecomposed) drops the flag, so its own samples ignore damping: the state is the posterior it samples."""
    laplace = pytest.importorskip("laplace")
    from edgebnn.exporters.config import ExportConfig
    from edgebnn.exporters.export import export_model

    root, members = trained
    x, y = torch.from_numpy(digits_data.x_train[:400]), torch.from_numpy(digits_data.y_train[:400])
    la = laplace.Laplace(copy.deepcopy(members[0]), "classification", subset_of_weights="all", hessian_structure="kron",
                         prior_precision=1.0, damping=True)
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=512))
    assert la.H.damping and not la.posterior_precision.damping  # the library's own drop of the flag
    state, out, onnx = tmp_path / "damped.pt", tmp_path / "la.ebnn", tmp_path / "la.onnx"
    torch.save(la.state_dict(), state)
    r = _lower(root, "mlp", MAP, out, "--laplace", state)
    assert r.exit_code == 0, r.output
    assert _invoke("export", out, "-S", 16, "--mode", "baked", "-o", onnx).exit_code == 0
    xs = digits_data.x_test[:50]
    baked = export_model(edgebnn.from_torch(la, (1, 1, 8, 8)), ExportConfig(16, mode="baked")).proto
    api = edgebnn.Session(baked).predict(xs).probs
    np.testing.assert_allclose(edgebnn.Session(str(onnx)).predict(xs).probs, api, atol=ROUNDOFF)
