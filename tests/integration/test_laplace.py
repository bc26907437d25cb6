"""laplace-torch posteriors imported and exported exactly, against the real library (issue 21, item 2).

A digits MLP (and a small CNN) trained for a few full-batch steps, its Laplace posterior fitted by laplace-torch
(default backend, prior precision 1), then imported with ``edgebnn.from_torch(la, ...)``:

- the covariance each encoding stores is laplace-torch's own ``posterior_precision`` inverted (exact, per block);
- the exported S = 64 predictive (``baked`` and ``noise``) is as close to a 4000-sample reference drawn with
  ``la.sample`` as laplace-torch's own S = 64 predictive is (the issue's goal: within 1.5x its Monte Carlo error
  + 0.002); the reference helper reproduces ``la(x, pred_type="nn")`` draw for draw;
- ``--mode analytic`` on a last-layer posterior equals ``la(x, pred_type="glm", link_approx="probit")``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import edgebnn
from edgebnn.errors import InvalidOptionError, UnsupportedLayerError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import from_bytes, to_bytes
from edgebnn.passes import lower
from edgebnn.runtime import Session

torch = pytest.importorskip("torch")
laplace = pytest.importorskip("laplace")
nn = torch.nn
DataLoader, TensorDataset = torch.utils.data.DataLoader, torch.utils.data.TensorDataset

S = 64
REF = 4000
N_TEST = 100
ROUNDOFF = 1e-5  # float32 arithmetic of the same formulas in another op order


@pytest.fixture(scope="module")
def digits_torch(digits_data):
    return torch.from_numpy(digits_data.x_train), torch.from_numpy(digits_data.y_train), digits_data.x_test[:N_TEST]


def _trained(net: Any, x: Any, y: Any, steps: int = 40) -> Any:
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(steps):  # full batch: a few milliseconds, test accuracy ~0.9
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval()


@pytest.fixture(scope="module")
def mlp(digits_mlps):
    """The session's MAP network (conftest: digits MLP 64-32-10, 40 full-batch Adam steps), a copy of it."""
    import copy

    return copy.deepcopy(digits_mlps[0])


def _fit(net: Any, data: Any, weights: str, structure: str) -> Any:
    x, y = data[0][:400], data[1][:400]  # the curvature of 400 images: a fit of a second or two
    la = laplace.Laplace(net, "classification", subset_of_weights=weights, hessian_structure=structure,
                         prior_precision=1.0)
    la.fit(DataLoader(TensorDataset(x, y), batch_size=512))
    return la


@pytest.fixture(scope="module")
def kron_ll(laplace_kron_ll):
    return laplace_kron_ll


@pytest.fixture(scope="module")
def full_ll(mlp, digits_torch):
    return _fit(mlp, digits_torch, "last_layer", "full")


@pytest.fixture(scope="module")
def diag_ll(mlp, digits_torch):
    return _fit(mlp, digits_torch, "last_layer", "diag")


@pytest.fixture(scope="module")
def diag_all(laplace_diag_all):
    return laplace_diag_all


_IRS: dict[int, Any] = {}


def _ir(la: Any) -> Any:
    """``edgebnn.from_torch(la)``, once per posterior (the ONNX export of the mean network takes seconds)."""
    if id(la) not in _IRS:
        _IRS[id(la)] = edgebnn.from_torch(la, (1, 1, 8, 8))
    return _IRS[id(la)]


def _probs(la: Any, x: np.ndarray, draws: Any) -> np.ndarray:
    """Mean softmax of the network at each of laplace-torch's parameter draws ``la.sample`` (what
    ``la(x, pred_type="nn")`` computes draw by draw), batched: [B, K]."""
    xt = torch.from_numpy(x)
    with torch.no_grad():
        if hasattr(la.model, "last_layer"):  # last layer: [vec W, b] on the MAP features
            _, phi = la.model.forward_with_features(xt)
            k, n = la.model.last_layer.weight.shape
            logits = torch.einsum("bi,ski->sbk", phi, draws[:, :k * n].reshape(-1, k, n)) + draws[:, None, k * n:]
        else:  # all weights of Flatten, Linear, ReLU, Linear
            shapes = [p.shape for p in la.params]
            parts = torch.split(draws, [p.numel() for p in la.params], dim=1)
            w1, b1, w2, b2 = (t.reshape(-1, *s) for t, s in zip(parts, shapes, strict=True))
            h = torch.relu(torch.einsum("bi,shi->sbh", xt.flatten(1), w1) + b1[:, None])
            logits = torch.einsum("sbh,skh->sbk", h, w2) + b2[:, None]
        return torch.softmax(logits, -1).mean(0).numpy()


def _library_error(la: Any, x: np.ndarray) -> tuple[np.ndarray, float]:
    """The 4000-draw reference predictive and the mean max-abs error of laplace-torch's own S = 64 predictive
    on it (10 repetitions)."""
    torch.manual_seed(123)
    ref = _probs(la, x, la.sample(REF))
    return ref, float(np.mean([np.abs(_probs(la, x, la.sample(S)) - ref).max() for _ in range(10)]))


def _export_error(ir: Any, x: np.ndarray, ref: np.ndarray, mode: str) -> float:
    """Mean max-abs error of edgebnn's S = 64 export on the reference (8 seeds: the max over 1000 entries is
    heavy-tailed, 4 repetitions of it scatter by about ±30%)."""
    return float(np.mean([np.abs(Session(export_model(ir, ExportConfig(S, mode=mode, seed=s, rng="host")).proto,
                                         seed=s).predict(x).probs - ref).max()
                          for s in range(8)]))


def test_the_reference_helper_is_laplace_torchs_nn_predictive(kron_ll, diag_all, digits_torch):
    x = digits_torch[2][:10]
    for la in (kron_ll, diag_all):
        torch.manual_seed(7)
        lib = la(torch.from_numpy(x), pred_type="nn", link_approx="mc", n_samples=8).numpy()
        torch.manual_seed(7)
        assert np.abs(_probs(la, x, la.sample(8)) - lib).max() < ROUNDOFF


@pytest.mark.parametrize("which", ["kron_ll", "diag_all", "full_ll"])
def test_exported_predictive_is_as_close_as_the_librarys_own(which, request, digits_torch):
    la = request.getfixturevalue(which)
    x = digits_torch[2]
    ir = _ir(la)
    ref, lib = _library_error(la, x)
    for mode in ("baked", "noise"):
        # the goal: S = 64 Monte Carlo error within 1.5x the library's own, + 0.002
        assert _export_error(ir, x, ref, mode) <= 1.5 * lib + 0.002, (which, mode, lib)


def test_kron_last_layer_stores_laplace_torchs_covariance(kron_ll):
    ir = _ir(kron_ll)
    kinds = {w.name: w.encoding.op_type for w in ir.encoded_weights()}
    assert kinds == {"3.weight": "KronGaussianWeight", "3.bias": "DenseGaussianWeight"}
    cov = kron_ll.posterior_precision.to_matrix(exponent=-1).double().numpy()  # block diag: [vec W, b]
    w, b = (ir.encoded_weight(n).encoding for n in ("3.weight", "3.bias"))
    basis = np.kron(w.q_out.astype(np.float64), w.q_in.astype(np.float64))
    cov_w = basis @ np.diag(np.square(w.scale.astype(np.float64)).reshape(-1)) @ basis.T
    n = w.size
    assert np.abs(cov_w - cov[:n, :n]).max() <= 1e-5 * np.abs(cov[:n, :n]).max()
    assert np.abs(b.covariance() - cov[n:, n:]).max() <= 1e-5 * np.abs(cov[n:, n:]).max()
    assert np.array_equal(w.mean().reshape(-1), kron_ll.mean[:n].numpy())
    # the IR round-trips through its file format with the verifier's checks
    again = from_bytes(to_bytes(ir), "kron.ebnn")
    assert np.array_equal(again.encoded_weight("3.weight").encoding.scale, w.scale)


def test_full_last_layer_folds_the_bias_into_one_joint_covariance(full_ll):
    ir = _ir(full_ll)
    (w,) = ir.encoded_weights()
    assert (w.name, w.encoding.op_type, w.encoding.shape) == ("3.aug.weight", "DenseGaussianWeight", (10, 33))
    cov = full_ll.posterior_covariance.double().numpy()  # over [vec W (10 x 32), b (10)]
    enc = w.encoding
    # W column 32 of the augmented layer is the bias: Cov(W[0, 5], b[3]) is laplace-torch's entry (5, 320 + 3)
    assert enc.covariance()[5, 3 * 33 + 32] == pytest.approx(cov[5, 320 + 3], rel=1e-4)
    assert enc.covariance()[2 * 33 + 32, 7 * 33 + 32] == pytest.approx(cov[322, 327], rel=1e-4)


def test_diag_all_weights_is_the_mean_field_gaussian_of_the_posterior(diag_all):
    ir = _ir(diag_all)
    assert [w.encoding.op_type for w in ir.encoded_weights()] == ["GaussianWeight"] * 4
    sigma = np.concatenate([ir.encoded_weight(n).encoding.stddev().reshape(-1)
                            for n in ("1.weight", "1.bias", "3.weight", "3.bias")])
    assert np.array_equal(sigma, diag_all.posterior_scale.numpy())


@pytest.mark.parametrize("which", ["kron_ll", "full_ll", "diag_ll"])
def test_last_layer_analytic_is_laplace_torchs_glm_probit(which, request, digits_torch):
    la = request.getfixturevalue(which)
    x = digits_torch[2]
    glm = la(torch.from_numpy(x), pred_type="glm", link_approx="probit").numpy()
    out = Session(export_model(_ir(la), ExportConfig(16, mode="analytic")).proto).predict(x)
    assert np.abs(out.probs - glm).max() < 1e-4  # the same closed form in float32 (the goal is 0.01)
    assert np.all(out.mutual_info >= 0) and out.mutual_info.mean() > 0.01


def test_an_unfitted_laplace_object_is_refused_in_one_line(mlp):
    for weights in ("all", "last_layer"):
        la = laplace.Laplace(mlp, "classification", subset_of_weights=weights, hessian_structure="kron")
        with pytest.raises(UnsupportedLayerError, match=r"^\w+: K\w+Laplace is not fitted: call la.fit") as e:
            edgebnn.from_torch(la, (1, 1, 8, 8))
        assert "\n" not in str(e.value)


def test_structures_edgebnn_cannot_import_exactly_are_refused(mlp):
    la = laplace.Laplace(mlp, "classification", subset_of_weights="all", hessian_structure="full")  # refused unfitted
    with pytest.raises(UnsupportedLayerError, match=r"FullLaplace is not imported; edgebnn imports DiagLaplace"):
        edgebnn.from_torch(la, (1, 1, 8, 8))


def test_lowering_schemes_on_laplace_irs(kron_ll, diag_all, digits_torch):
    x = digits_torch[2][:20]
    diag = lower(_ir(diag_all), "fixed", seed=0)
    assert {r["kind"] for r in diag.report["layers"]} == {"FixedPointWeight"}  # diag: every scheme applies
    kron = _ir(kron_ll)
    assert lower(kron, "float").model.encoded_weight("3.weight").encoding.op_type == "KronGaussianWeight"
    fixed = lower(kron, "fixed", seed=0)  # the mean on a grid, the factors coded (edgebnn.families.laplace)
    assert [r["kind"] for r in fixed.report["layers"]] == ["KronFixedWeight", "DenseFixedWeight"]
    with pytest.raises(InvalidOptionError, match="codebook cannot lower"):
        lower(kron, "codebook", seed=0)
    assert Session(export_model(fixed.model, ExportConfig(8, mode="noise",
                                                          rng="host")).proto).predict(x).probs.shape == (20, 10)


def test_kron_on_all_weights_of_a_cnn(digits_torch):
    """Conv weights [out, in, k, k] are Kronecker-factored as [out, in·k·k]: the covariance the IR stores is
    laplace-torch's, block by block; the draws run in the graph; analytic refuses a hidden Kronecker layer."""
    torch.manual_seed(0)
    net = _trained(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 10)),
                   *digits_torch[:2], steps=20)
    la = _fit(net, digits_torch, "all", "kron")
    ir = edgebnn.from_torch(la, (1, 1, 8, 8))
    assert [w.encoding.op_type for w in ir.encoded_weights()] == ["KronGaussianWeight", "DenseGaussianWeight"] * 2
    cov = la.posterior_precision.to_matrix(exponent=-1).double().numpy()
    start = 0
    for w in ir.encoded_weights():
        enc = w.encoding
        if enc.op_type == "KronGaussianWeight":
            basis = np.kron(enc.q_out.astype(np.float64), enc.q_in.astype(np.float64))
            mine = basis @ np.diag(np.square(enc.scale.astype(np.float64)).reshape(-1)) @ basis.T
        else:
            mine = enc.covariance()
        block = cov[start:start + enc.size, start:start + enc.size]
        assert np.abs(mine - block).max() <= 1e-5 * np.abs(block).max(), w.name
        start += enc.size
    assert start == len(cov)
    x = digits_torch[2][:20]
    probs = Session(export_model(ir, ExportConfig(8, mode="noise", rng="host")).proto).predict(x).probs
    assert probs.shape == (20, 10) and np.allclose(probs.sum(1), 1, atol=1e-5)
    with pytest.raises(InvalidOptionError, match=r"layer '0' is KronGaussianWeight \(Laplace posterior\): "
                                                 r"--mode analytic is exact for it only as the last layer"):
        export_model(ir, ExportConfig(8, mode="analytic"))


def test_the_float_bnn_baseline_draws_the_kronecker_posterior(kron_ll, digits_torch):
    """``profile``'s float_bnn baseline (RandomNormal in the graph, one draw per run) draws the whole Kronecker
    posterior, not its mean field: 64 runs are as close to the reference as laplace-torch's own 64 draws (the
    mean-field Gaussian of the same marginals is 10x further on this model)."""
    import onnxruntime as ort
    from onnx import helper

    from edgebnn.exporters.ensemble import float_bnn

    x = digits_torch[2]
    ref, lib = _library_error(kron_ll, x)
    proto = float_bnn(_ir(kron_ll))
    for i, node in enumerate(n for n in proto.graph.node if n.op_type == "RandomNormal"):
        node.attribute.append(helper.make_attribute("seed", float(i + 1)))  # onnxruntime: a fixed stream per node
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    errs = [np.abs(np.mean([sess.run(["probs"], {"input": x})[0] for _ in range(S)], axis=0) - ref).max()
            for _ in range(8)]
    assert np.mean(errs) <= 1.5 * lib + 0.002
