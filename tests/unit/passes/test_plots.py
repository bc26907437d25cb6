"""``plot_layers`` writes a PNG for Gaussian and lowered models (Agg, no display)."""

from __future__ import annotations

from edgebnn.passes import lower
from edgebnn.plots import plot_layers

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_float_and_codebook_layers(make_mlp, tmp_path) -> None:
    model = make_mlp((16, 128, 10))
    lowered = lower(model, "codebook").model
    for name, m, ref in (("float.png", model, None), ("codebook.png", lowered, model), ("bare.png", lowered, None)):
        path = plot_layers(m, tmp_path / name, reference=ref, max_points=500)
        assert path.read_bytes()[:8] == PNG_MAGIC
