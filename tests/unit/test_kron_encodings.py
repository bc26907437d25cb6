"""The correlated Gaussian encodings (Kronecker-factored and dense Laplace posteriors) without torch.

A linear model ``logits = x Wᵀ + b`` with ``W`` a ``KronGaussianWeight`` and ``b`` a ``DenseGaussianWeight``: the
draws in the ``noise`` graph are the encodings' formulas on the noise fed to it (to round-off), the stored tensors
are validated, the covariance is the dense Kronecker form, and moment propagation refuses it where it is not exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.exporters.config import ExportConfig
from edgebnn.exporters.export import export_model
from edgebnn.ir import DOMAIN, BNNModel, Manifest, from_bytes, make_encoding_node, to_bytes, verify
from edgebnn.ir.encodings import DenseGaussianWeight, KronGaussianWeight
from edgebnn.runtime import Session

K, N = 3, 4
ROUNDOFF = 1e-5  # float32 arithmetic in another op order


def _orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((n, n)))[0]


def _encodings(seed: int = 0) -> tuple[KronGaussianWeight, DenseGaussianWeight]:
    rng = np.random.default_rng(seed)
    w = KronGaussianWeight(rng.standard_normal((K, N)), _orthogonal(rng, K), _orthogonal(rng, N),
                           rng.uniform(0.2, 0.8, (K, N)))
    b = DenseGaussianWeight(rng.standard_normal(K), np.tril(rng.uniform(0.1, 0.5, (K, K))))
    return w, b


def _linear(hidden: bool = False) -> BNNModel:
    """input [batch, N] -> Gemm(Kron W, dense b) -> logits (``hidden``: a ReLU and a plain Gemm after it)."""
    w, b = _encodings()
    graph = helper.make_graph([], "kron_linear", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", N])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", K])])
    graph.node.append(make_encoding_node(graph, "fc.weight", "fc", w))
    graph.node.append(make_encoding_node(graph, "fc.bias", "fc", b))
    graph.node.append(helper.make_node("Gemm", ["input", "fc.weight", "fc.bias"], ["h" if hidden else "logits"],
                                       transB=1))
    if hidden:
        graph.initializer.append(numpy_helper.from_array(np.eye(K, dtype=np.float32), "out.weight"))
        graph.node.append(helper.make_node("Relu", ["h"], ["r"]))
        graph.node.append(helper.make_node("Gemm", ["r", "out.weight"], ["logits"], transB=1))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return BNNModel(model, Manifest(source_library="synthetic", input_name="input", input_shape=[1, N],
                                    num_classes=K), "kron_linear")


def test_the_in_graph_draw_is_the_encodings_formula():
    model = _linear()
    verify(model)
    w, b = (model.encoded_weight(n).encoding for n in ("fc.weight", "fc.bias"))
    samples = 5
    sess = Session(export_model(model, ExportConfig(samples, mode="noise",
                                                    rng="host")).proto)  # auto: a correlated layer is drawn whole
    rng = np.random.default_rng(1)
    z = rng.standard_normal((samples, K, N)).astype(np.float32)
    zb = rng.standard_normal((samples, K)).astype(np.float32)
    x = rng.standard_normal((2, N)).astype(np.float32)
    got = sess.predict(x, noise={"noise/fc.weight": z, "noise/fc.bias": zb}).probs
    ws = w.mu + w.q_out @ (z * w.scale) @ w.q_in.T
    bs = b.mu + zb @ b.scale.T
    logits = np.einsum("bi,ski->bsk", x, ws) + bs[None]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    assert np.abs(got - (e / e.sum(-1, keepdims=True)).mean(1)).max() < ROUNDOFF


def test_moments_and_draws_follow_the_kronecker_covariance():
    w, b = _encodings()
    basis = np.kron(w.q_out.astype(np.float64), w.q_in.astype(np.float64))
    cov = basis @ np.diag(np.square(w.scale.astype(np.float64)).reshape(-1)) @ basis.T
    assert np.allclose(w.stddev().reshape(-1) ** 2, np.diag(cov), rtol=1e-5)
    draws = w.sample(np.random.default_rng(0), 20000).reshape(20000, -1).astype(np.float64)
    # the empirical covariance of 20000 draws: each entry within ~4 standard errors (sd ≤ 0.8·√2/√20000 ≈ 0.008)
    assert np.abs(np.cov(draws.T) - cov).max() < 0.04
    assert np.allclose(b.covariance(), b.scale.astype(np.float64) @ b.scale.T.astype(np.float64))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("fc.weight.scale", -np.ones((K, N), np.float32), "scale has negative values"),
    ("fc.weight.q_in", np.eye(N + 1, dtype=np.float32), r"q_in has shape \(5, 5\), expected \(4, 4\)"),
    ("fc.bias.scale", np.ones((K + 1, K), np.float32), r"scale has shape \(4, 3\), expected \(3, r >= 1\)"),
    ("fc.bias.mu", np.full(K, np.nan, np.float32), "mu has NaN or inf"),
])
def test_stored_factors_are_validated(field, value, message):
    model = _linear()
    for t in model.proto.graph.initializer:
        if t.name == field:
            t.CopyFrom(numpy_helper.from_array(value, field))
    with pytest.raises(InvalidArtifactError, match=message):
        verify(model)


def test_round_trip_and_analytic():
    model = from_bytes(to_bytes(_linear()), "kron.ebnn")
    assert np.array_equal(model.encoded_weight("fc.weight").encoding.q_in, _encodings()[0].q_in)
    # its only layer writes the logits: the GLM/probit predictive with the exact logit variance of each family
    w, b = _encodings()
    x = np.random.default_rng(3).standard_normal((2, N)).astype(np.float32)
    basis = np.kron(w.q_out.astype(np.float64), w.q_in.astype(np.float64))
    cov = (basis @ np.diag(np.square(w.scale.astype(np.float64)).reshape(-1)) @ basis.T).reshape(K, N, K, N)
    var = np.einsum("bi,kikj,bj->bk", x, cov, x) + np.diag(b.covariance())
    z = (x @ w.mu.T + b.mu) / np.sqrt(1 + np.pi / 8 * var)
    probit = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    got = Session(export_model(model, ExportConfig(8, mode="analytic")).proto).predict(x).probs
    assert np.abs(got - probit).max() < ROUNDOFF
    with pytest.raises(InvalidOptionError, match=r"layer 'fc' is KronGaussianWeight \(Laplace posterior\): --mode "
                                                 r"analytic is exact for it only as the last layer"):
        export_model(_linear(hidden=True), ExportConfig(8, mode="analytic"))
