"""The IR :func:`edgebnn.lower` returns: a :class:`~edgebnn.ir.BNNModel` that carries its lowering report."""

from __future__ import annotations

from typing import Any

from edgebnn.ir import BNNModel


class LoweredModel(BNNModel):
    """A lowered IR (use it wherever a ``BNNModel`` goes) with ``lowering_report``: ``scheme``, ``seed``,
    ``layers`` (per-layer rows), ``total_bytes``, ``float_bnn_bytes``, ``compression_ratio``, ``ebnn_bytes``."""

    def __init__(self, model: BNNModel, report: dict[str, Any]) -> None:
        super().__init__(model.proto, model.manifest, model.where)
        self.lowering_report = report
