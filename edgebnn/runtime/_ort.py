"""onnxruntime failures as one line: the artifact, the op and node that failed, onnxruntime's reason.

onnxruntime raises its own exception classes (``Fail``, ``InvalidArgument``, ``RuntimeException``,
``InvalidGraph``, ... from ``onnxruntime.capi.onnxruntime_pybind11_state``) with messages such as::

    [ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running LSTM node. Name:'node_lstm'
    Status Message: Input initial_h must have shape {1,1,16}. Actual:{1,640,16}
    [ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx failed:Node (fc) Op (Gemm) [ShapeInferenceError] ...

:func:`ort_errors` turns them, on session creation and on every run, into :class:`ArtifactRuntimeError`:
``m.onnx: onnxruntime failed in LSTM node 'node_lstm': Input initial_h must have shape ...``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx

from edgebnn.errors import ArtifactRuntimeError

_RUNNING = re.compile(r"running (?P<op>[\w.]+) node\. Name:'(?P<node>[^']*)' Status Message: (?P<why>.*)", re.S)
_LOADING = re.compile(r"Node \((?P<node>[^)]*)\) Op \((?P<op>[\w.]+)\)\s*(?P<why>.*)", re.S)
_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
MAX_REASON = 300  # characters of onnxruntime's reason kept on the line


def external_data_options(opts: Any, proto: onnx.ModelProto, where: str | None) -> None:
    """Point onnxruntime, which gets the model's bytes, at the folder of an export written with external data
    (a ``.onnx`` past 2 GiB and its ``.data``); nothing for a self-contained one."""
    from edgebnn.exporters.metadata import external_data_folder

    folder = external_data_folder(proto, where or "<model>")
    if folder is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)


def is_ort_error(e: BaseException) -> bool:
    """Whether ``e`` is onnxruntime's (its own exception classes, or its ``[ONNXRuntimeError]`` messages)."""
    return type(e).__module__.startswith("onnxruntime") or "[ONNXRuntimeError]" in str(e)


def describe(where: str, e: BaseException) -> str:
    """One line: ``<where>: onnxruntime failed in <op> node '<name>': <reason>``."""
    text = _PREFIX.sub("", str(e).strip())
    match = _RUNNING.search(text) or _LOADING.search(text)
    if match is not None:
        at = f" in {match['op']} node {match['node']!r}"
        why = match["why"]
    else:
        at, why = "", text
    why = " ".join(why.split()) or type(e).__name__
    if len(why) > MAX_REASON:
        why = why[:MAX_REASON - 3] + "..."
    return f"{where}: onnxruntime failed{at}: {why}"


@contextmanager
def ort_errors(where: str) -> Iterator[None]:
    """Re-raise onnxruntime's exceptions inside the block as :class:`ArtifactRuntimeError` naming ``where``."""
    try:
        yield
    except ArtifactRuntimeError:
        raise
    except Exception as e:
        if not is_ort_error(e):
            raise
        raise ArtifactRuntimeError(describe(where, e)) from e


def check_finite(outputs: list[np.ndarray], where: str) -> None:
    """Refuse NaN or infinite outputs of finite inputs: a corrupt weight (a flipped exponent bit) gives them, and
    every metric downstream would fail on them or hide them."""
    for out in outputs:
        bad = ~np.isfinite(np.asarray(out, dtype=np.float64))
        if bad.any():
            row = int(np.argwhere(bad)[0][0]) if bad.ndim else 0
            raise ArtifactRuntimeError(f"{where}: the model gave NaN or infinite outputs (first at row {row}) for "
                                       "finite inputs; its weights may be corrupt")
