"""Tasks as registered objects (edgebnn.tasks): the built-in tasks go through the public registry, the registry
refuses what it cannot keep apart, and a file of a task nobody registered stops every command in one line."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from rich.console import Console
from synthetic import synthetic_cnn

import edgebnn
from edgebnn.cli import main
from edgebnn.data import ClassLabels, ClassMasks, FloatTargets
from edgebnn.errors import InvalidArtifactError, InvalidOptionError
from edgebnn.tables import print_eval
from edgebnn.tasks import (
    TASKS,
    Classification,
    Regression,
    Segmentation,
    Task,
    option_task,
    register_task,
    task_class,
)

UNKNOWN = (r"task 'nosuchtask' is not known to this edgebnn \(known: [^;]*classification, [^;]*regression, "
           r"segmentation \(dense\)[^;]*\); install or load the plug-in that defines it \(--plugin MODULE\)$")


def test_the_built_in_tasks_are_registered_task_classes() -> None:
    for name, cls in (("classification", Classification), ("regression", Regression),
                      ("segmentation", Segmentation)):
        assert TASKS[name] is cls and issubclass(cls, Task) and cls.name == name
    assert option_task("dense") is Segmentation
    assert Task.parse(None, None, "old.ebnn") == Classification()  # files before tasks
    task = Task.parse("regression", {"head": "mean", "dims": 2, "noise_var": 0.5}, "m.ebnn")
    assert task == Regression("mean", 2, 0.5) and task.record() == {
        "task": "regression", "task_options": {"head": "mean", "dims": 2, "noise_var": 0.5}}
    assert Classification().record() == {}  # classifiers' files keep their bytes
    assert (Classification().targets(10), Regression("mean", 2).targets(2), Segmentation((3, 4, 5)).targets(3)) == (
        ClassLabels(), FloatTargets((2,)), ClassMasks((4, 5)))


def test_the_registry_refuses_what_it_cannot_keep_apart() -> None:
    before = dict(TASKS)

    class Again(Classification):
        name = "classification"

    class Alias(Classification):
        name = "pixels"
        aliases = ("dense",)

    class Nameless(Classification):
        name = ""

    with pytest.raises(ValueError, match=r"^task 'classification' registered twice \(edgebnn\.tasks\.classification"
                                         r"\.Classification, .*Again\)$"):
        register_task(Again)
    with pytest.raises(ValueError, match=r"^task 'dense' registered twice"):
        register_task(Alias)
    with pytest.raises(ValueError, match="has no name"):
        register_task(Nameless)
    with pytest.raises(TypeError, match=r"is not a subclass of edgebnn\.tasks\.Task"):
        register_task(dict)  # type: ignore[type-var]
    assert before == TASKS


def test_stored_options_are_checked() -> None:
    with pytest.raises(InvalidArtifactError, match=r"^m\.onnx: task classification takes no options, the file gives "
                                                   r"\['shape'\]$"):
        Task.parse("classification", {"shape": [3, 4]}, "m.onnx")
    with pytest.raises(InvalidArtifactError, match=r"^m\.onnx: segmentation task shape \[3\] is not"):
        Task.parse("segmentation", {"shape": [3]}, "m.onnx")
    with pytest.raises(InvalidArtifactError, match=r"^m\.onnx: regression task options"):
        Task.parse("regression", {"head": "median", "dims": 1}, "m.onnx")
    with pytest.raises(InvalidArtifactError, match=r"^m\.onnx: " + UNKNOWN):
        task_class("nosuchtask", "m.onnx")
    with pytest.raises(InvalidOptionError, match=r"^--task: " + UNKNOWN):
        option_task("nosuchtask")


def _retask(path, key: str) -> None:
    """Rewrite the task recorded under metadata ``key`` of the file at ``path`` to one nobody registered."""
    proto = onnx.load(str(path))
    for entry in proto.metadata_props:
        if entry.key == key:
            record = json.loads(entry.value)
            record["task"] = "nosuchtask"
            entry.value = json.dumps(record, sort_keys=True)
    onnx.save(proto, str(path))


def test_a_file_of_an_unknown_task_is_one_line(tmp_path) -> None:
    """The .ebnn's manifest or the export's metadata names a task no loaded module registered: every command
    that opens it ends in one line naming the file and the task (exit 2), never a KeyError."""
    model = synthetic_cnn(sigma=0.3)
    ebnn, export = tmp_path / "m.ebnn", tmp_path / "m.onnx"
    edgebnn.save(model, ebnn)
    edgebnn.export(model, export, samples=4, mode="baked")
    _retask(ebnn, "edgebnn.manifest")
    _retask(export, "edgebnn.export")
    x = np.zeros((4, 1, 6, 6), np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(4, np.int64))
    for args, where in ((["eval", str(export), "--data", str(tmp_path / "d.npz")], f"{export}: "),
                        (["inspect", str(export)], f"{export}: "),
                        (["eval", str(ebnn), "--data", str(tmp_path / "d.npz")], f"{ebnn}: manifest: "),
                        (["inspect", str(ebnn)], f"{ebnn}: manifest: "),
                        (["export", str(ebnn), "-o", str(tmp_path / "x.onnx")], f"{ebnn}: manifest: "),
                        (["compare", str(export), str(ebnn), "--data", str(tmp_path / "d.npz")], f"{export}: ")):
        r = CliRunner().invoke(main, args)
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1, (args, r.output)
        assert re.match("^error: " + re.escape(where) + UNKNOWN, lines[0]), (args, lines[0])
    with pytest.raises(InvalidArtifactError, match=re.escape(f"{export}: ") + UNKNOWN):
        edgebnn.Session(export)


def _eval_lines(report: dict) -> str:
    buf = io.StringIO()
    base = {"artifact": "/d/m.onnx", "runtime": "onnxruntime", "data": "d.npz", "split": None, "n": 8, "samples": 4}
    print_eval(Console(file=buf, width=120, force_terminal=False, color_system=None), [{**base, **report}])
    return buf.getvalue()


def test_the_eval_table_is_the_tasks() -> None:
    """Columns and the line under them come from the report's task (edgebnn.tasks.Task.columns, .summary)."""
    text = _eval_lines({"task": "regression", "nll": 1.25, "rmse": 0.5, "mae": 0.375, "calibration_error": 0.0625,
                        "coverage": {"50": 0.5, "90": 0.875, "95": 1.0}, "variance": 0.25, "aleatoric": 0.125,
                        "epistemic": 0.125})
    assert "rmse" in text and "1.2500" in text and "accuracy" not in text
    assert "m.onnx: coverage 50%: 0.500 · 90%: 0.875 · 95%: 1.000 · variance 0.25 = aleatoric 0.125 + epistemic " \
           "0.125" in text
    text = _eval_lines({"task": "segmentation", "pixel_accuracy": 0.75, "mean_iou": 0.5, "nll": 0.625, "ece": 0.125,
                        "iou": [0.5, None, 0.25]})
    assert "mean_iou" in text and "0.5000" in text and "m.onnx: IoU per class 0.500 - 0.250" in text
    text = _eval_lines({"accuracy": 0.75, "nll": 0.625, "ece": 0.125, "brier": 0.25})
    assert "brier" in text and "0.2500" in text and "m.onnx:" not in text  # a classifier: no line under it
