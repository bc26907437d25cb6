"""A task's contract (:class:`Task`), the registry of tasks (:data:`TASKS`, :func:`register_task`,
:func:`task_class`) and what a head may ask of the graph builder (:class:`GraphBuilder`).

A task is one subclass of :class:`Task`, registered once: what the network's output is, how S member outputs
reduce to the predictive (in the graph, sampled and analytic, and in numpy), its metrics and eval-table columns,
the targets a data file holds for it, what ``compare`` compares, its options as the IR manifest and the export
metadata record them. The built-in tasks (:mod:`.classification`, :mod:`.segmentation`, :mod:`.regression`)
register the same way a plug-in's does (docs/extending.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgebnn.errors import EdgeBNNError, InvalidArtifactError, InvalidOptionError
from edgebnn.metrics import AnyPredictive, Predictive
from edgebnn.registry import REGISTRY, Table

if TYPE_CHECKING:
    from edgebnn.data import Targets

PREFIX = "ens/"  # of every value an exporter adds (exporters._graph.P): a head names its inner values under it
EPS_PROBS = 1e-12
VAR_FLOOR = 1e-12  # keeps √v finite where a logit has no variance
DEFAULT_TASK = "classification"  # the task of a file or report that records none (every file written before tasks)
PLUGIN_HINT = "install or load the plug-in that defines it (--plugin MODULE)"


class GraphBuilder(Protocol):
    """What a head needs of the exporter's graph builder (:class:`edgebnn.exporters._graph.Builder`)."""

    @property
    def store_choice(self) -> str:
        """How the moments are stored: "fp32", or a compact store (a head then builds its constants in the graph)."""
        ...

    outputs: list[onnx.ValueInfoProto] | None  # the graph outputs, set once the head is added

    def add(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        """Add node ``op(inputs) -> output`` (attributes ``attrs``); returns ``output``."""
        ...

    def i64(self, name: str, *values: int) -> str:
        """An int64 constant ``name`` holding ``values`` (a 1-D tensor); returns its name."""
        ...

    def f32(self, name: str, value: float | np.ndarray) -> str:
        """A float32 constant ``name`` (a scalar or an array); returns its name."""
        ...


# (samples Q, dims) -> [Q, dims] standard-normal quadrature points (exporters.analytic.quadrature_points)
Points = Callable[[int, int], np.ndarray]


class MetricAccumulator(Protocol):
    """A task's running metrics over a stream of batches (``eval``, ``compare``, ``lower --eval``)."""

    def add_predictive(self, pred: AnyPredictive, y: np.ndarray) -> None:
        """Add one batch: the predictive of ``x`` and its labels ``y`` (as the task's targets cast them)."""
        ...

    def report(self) -> dict[str, Any]:
        """The metrics so far: every :attr:`Task.columns` key (floats), and any others the task reports."""
        ...

    def reliability(self) -> dict[str, list[float]]:
        """What the ``eval --plot`` picture of :attr:`Task.plot` draws (module :mod:`edgebnn.plots`)."""
        ...


@dataclass(frozen=True)
class Task(ABC):
    """What a network's output is and how S member outputs reduce to its predictive; subclass it and register the
    subclass (:func:`register_task`). An instance is the task with its options (those the manifest records).

    Class attributes (a subclass sets those that differ):
        name: The task's name in manifests, export metadata, reports and ``--task``; unique.
        aliases: Other names ``--task`` takes for it.
        outputs: The exported graph's outputs, in order (the names of :meth:`predictive`'s fields).
        columns: The metrics of :meth:`metrics`' report that ``eval`` and ``compare`` tabulate.
        default_objectives: ``search``'s default objectives for the task (names of its objectives).
        budget_metrics: Metrics of its own report, beyond the built-in ones (:data:`edgebnn.budget.METRICS`), that
            ``lower --budget`` may bound: name -> ``"max"`` (higher is better) or ``"min"``; each a float of the
            report, bounded by the paired bootstrap (docs/extending.md, "A task").
        import_options: The ``from_torch`` keyword options :meth:`from_output` takes (``noise_var``, ...).
        joins_output_pair: ``from_torch`` joins a ``forward`` returning (mean, log-variance) into one output.
        softmax_axis: The axis of one member's output over which its predictive is a softmax, or None: a
            ``LogSoftmax`` there leaves the predictive unchanged, so ``analytic`` mode passes it through.
        softmax_classifier: [B, K] logits, class-index labels, the mean softmax as predictive: what the GLM probit
            head (``analytic`` on a last-layer posterior) and INT8 calibration (accuracy/NLL/ECE) assume.
        plot: The ``eval --plot`` picture beside the epistemic histogram: ``reliability`` (the confidence bins of
            :meth:`MetricAccumulator.reliability`: count, confidence, accuracy), ``coverage`` (its nominal and
            observed interval coverage) or ``maps`` (reliability, and the first input's mask, predicted mask and
            mutual-information map: per-pixel ``probs`` [N, C, *sp]).
        ood_scores: What the predictive's ``ood_scores()`` returns, (total, epistemic) uncertainty, as ``eval
            --ood-data`` names them: the report's ``ood.scores`` and every table's and message's label (the report's
            keys stay ``auroc_mutual_info``, ``mean_mutual_info_in``, ... for every task); ``ood_short``: the
            two as table headers name them.
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    outputs: ClassVar[tuple[str, ...]] = ("probs", "entropy", "mutual_info")
    columns: ClassVar[tuple[str, ...]] = ("nll",)
    default_objectives: ClassVar[tuple[str, ...]] = ("bytes", "nll")
    budget_metrics: ClassVar[Mapping[str, str]] = {}
    import_options: ClassVar[tuple[str, ...]] = ()
    joins_output_pair: ClassVar[bool] = False
    softmax_axis: ClassVar[int | None] = None
    softmax_classifier: ClassVar[bool] = False
    plot: ClassVar[str] = "reliability"
    ood_scores: ClassVar[tuple[str, str]] = ("entropy", "mutual information")
    ood_short: ClassVar[tuple[str, str]] = ("entropy", "MI")

    # -- what the files record ------------------------------------------------------------------------------

    @classmethod
    def parse(cls, name: str | None, options: Mapping[str, Any] | None, where: str) -> Task:
        """The task stored as ``name`` and ``options`` (``name`` None: :data:`DEFAULT_TASK`, what files before
        tasks meant).

        Raises:
            InvalidArtifactError: A task no loaded module registered, or malformed options (names ``where``).
        """
        return task_class(name or DEFAULT_TASK, where).from_options(dict(options or {}), where)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> Task:
        """The task of the stored ``options`` (:meth:`options`); the default takes none.

        Raises:
            InvalidArtifactError: Options it does not take, or malformed ones (one line naming ``where``).
        """
        if options:
            raise InvalidArtifactError(f"{where}: task {cls.name} takes no options, the file gives "
                                       f"{sorted(options)}")
        return cls()

    def options(self) -> dict[str, Any] | None:
        """The task's options as stored beside its name (None: nothing to store)."""
        return None

    def record(self, *, options: bool = True) -> dict[str, Any]:
        """What a manifest, an export's metadata (``options``) or a report records of the task: nothing for
        :data:`DEFAULT_TASK` (so files and reports of classifiers keep their bytes), else ``task`` (and
        ``task_options``)."""
        if self.name == DEFAULT_TASK:
            return {}
        return {"task": self.name, **({"task_options": self.options()} if options else {})}

    @classmethod
    def from_output(cls, shape: tuple[int, ...], where: str, **options: Any) -> Task:
        """The task of a torch model whose output (of a probe batch) has ``shape``, with the ``from_torch``
        options it takes (:attr:`import_options`; those given, not None); the default takes none and
        needs ``[batch, outputs]``.

        Raises:
            UnsupportedLayerError: An output the task cannot take (one line naming ``where`` and the shape).
            InvalidOptionError: A bad option.
        """
        from edgebnn.errors import UnsupportedLayerError

        if len(shape) != 2:
            raise UnsupportedLayerError(f"{where}: task {cls.name} needs a [batch, outputs] output, got "
                                        f"{list(shape)}")
        return cls()

    def describe(self, classes: int) -> str:
        """The output in words, for ``inspect`` and ``lower`` (``classes``: the manifest's ``num_classes``)."""
        return f"{self.name} of {classes} outputs"

    def check_output(self, shape: Sequence[int | None] | None, classes: int, output: str, where: str) -> None:
        """Refuse an IR whose graph output (``shape``: its inferred shape, None where unknown) does not fit
        the task and the manifest's ``num_classes``.

        Raises:
            InvalidArtifactError: One line naming ``where`` and the output.
        """
        if shape and shape[-1] is not None and shape[-1] != classes:
            raise InvalidArtifactError(
                f"{where}: graph output {output!r} has {shape[-1]} classes, the manifest says {classes}")

    # -- the graph ------------------------------------------------------------------------------------------

    @abstractmethod
    def sampled(self, b: GraphBuilder, outputs: str, samples: int, classes: int) -> None:
        """Add the head from the member outputs ``outputs`` [B·S, ...] (row b·S + s, every sampling mode): the
        graph values named :attr:`outputs`."""

    @abstractmethod
    def analytic(self, b: GraphBuilder, m: str, v: str | None, samples: int, classes: int, points: Points) -> None:
        """Add the head from the output's Gaussian moments ``m``, ``v`` (``v`` None: variance 0) of ``analytic``
        mode; ``points(Q, dims)`` gives fixed standard-normal quadrature points, ``samples`` is Q."""

    @abstractmethod
    def output_infos(self, classes: int) -> list[onnx.ValueInfoProto]:
        """The graph outputs' value infos (names :attr:`outputs`, batch axis ``batch``)."""

    def baseline_output(self, output: str) -> onnx.NodeProto:
        """The one node that ends a float one-pass baseline (``profile``'s): ``probs`` from the network's output
        ``output`` (timed, never read as a predictive; its one output is renamed ``probs`` whatever it is named).
        The default passes it through."""
        return helper.make_node("Identity", [output], ["probs"])

    # -- numpy ----------------------------------------------------------------------------------------------

    @abstractmethod
    def reduce(self, outputs: np.ndarray) -> AnyPredictive:
        """The same reduction as :meth:`sampled` in numpy, on member outputs ``[S, N, ...]`` (the reference
        runtime's)."""

    def predictive(self, arrays: Sequence[np.ndarray]) -> AnyPredictive:
        """The predictive from the graph's :attr:`outputs` (``Session.predict``): a
        :class:`~edgebnn.metrics.Predictive` of ``probs``, ``entropy``, ``mutual_info`` by default."""
        return Predictive(*arrays)

    @abstractmethod
    def members(self, outputs: np.ndarray) -> np.ndarray:
        """What ``compare`` compares, per member: ``[S, N, ...]`` from member outputs ``[S, N, ...]`` (each
        member's probabilities, its means); their mean over members is :meth:`point` of the predictive."""

    def point(self, pred: AnyPredictive) -> np.ndarray:
        """What ``compare`` compares, per example: the predictive's first output (``probs`` by default)."""
        return np.asarray(getattr(pred, self.outputs[0]))

    # -- metrics and data -----------------------------------------------------------------------------------

    @abstractmethod
    def metrics(self, classes: int) -> MetricAccumulator:
        """A fresh metric accumulator (``eval``, ``compare``, ``lower --eval``)."""

    @abstractmethod
    def targets(self, classes: int) -> Targets:
        """What one label of a data file is and how it is checked (:class:`edgebnn.data.Targets`)."""

    @classmethod
    def summary(cls, report: Mapping[str, Any]) -> str | None:
        """A line under the ``eval`` table for ``report`` (the task's metrics beyond :attr:`columns`), or None."""
        return None


T = TypeVar("T", bound=type[Task])

TASKS: Table[type[Task]] = REGISTRY.tasks
"""The registered tasks by name (:func:`register_task`): the built-in ones and those of the plug-ins imported (the
registry's table; read, never written)."""


def register_task(cls: T) -> T:
    """Register the task class ``cls`` under its ``name`` (and its ``aliases``): a class decorator, or call it.

    Raises:
        TypeError: ``cls`` is no :class:`Task` subclass.
        ValueError: ``cls`` has no name, or a name or alias is taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task: {cls!r} is not a subclass of edgebnn.tasks.Task")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_task: {cls.__qualname__} has no name")
    for n in (name, *cls.aliases):
        other = _lookup(n)
        if other is not None:
            raise ValueError(f"task {n!r} registered twice ({other.__module__}.{other.__qualname__}, "
                             f"{cls.__module__}.{cls.__qualname__})")
    TASKS.add(name, cls)
    return cls


def _lookup(name: str) -> type[Task] | None:
    if name in TASKS:
        return TASKS[name]
    return next((t for t in TASKS.values() if name in t.aliases), None)


def known_tasks() -> str:
    """The registered tasks' names (aliases in parentheses), for messages: ``classification, regression, ...``."""
    return ", ".join(n + (f" ({', '.join(t.aliases)})" if t.aliases else "") for n, t in sorted(TASKS.items()))


def task_class(name: str, where: str, error: type[EdgeBNNError] = InvalidArtifactError) -> type[Task]:
    """The task registered as ``name`` (or an alias); on a miss, the registry's loader hook loads the plug-ins (the
    entry points and ``$EDGEBNN_PLUGINS``) and it is looked up again.

    Args:
        name: The task's name.
        where: What names it, for the message: the file (``m.onnx``) or the option (``--task``).
        error: The error to raise: :class:`InvalidArtifactError` for a file, :class:`InvalidOptionError` for an
            option.

    Raises:
        EdgeBNNError: ``error``: no loaded module registered ``name``; one line naming ``where``, the known tasks
            and how to load the one missing.
    """
    found = _lookup(name)
    if found is None:
        REGISTRY.ensure_loaded()
        found = _lookup(name)
    if found is None:
        raise error(f"{where}: task {name!r} is not known to this edgebnn (known: {known_tasks()}); {PLUGIN_HINT}")
    return found


def option_task(name: str) -> type[Task]:
    """The task ``--task NAME`` (or ``task=`` of ``from_torch``) names.

    Raises:
        InvalidOptionError: An unknown task (one line).
    """
    return task_class(name, "--task", InvalidOptionError)


def sampled_head(b: GraphBuilder, outputs: str, samples: int, classes: int, task: Task) -> None:
    """End the graph with ``task``'s head from the member outputs [B·S, ...] and set ``b``'s graph outputs."""
    task.sampled(b, outputs, samples, classes)
    b.outputs = task.output_infos(classes)


def analytic_head(b: GraphBuilder, m: str, v: str | None, samples: int, classes: int, task: Task,
                  points: Points) -> None:
    """End the graph with ``task``'s head from the output's Gaussian moments (``v`` None: variance 0) and set
    ``b``'s graph outputs."""
    task.analytic(b, m, v, samples, classes, points)
    b.outputs = task.output_infos(classes)


def predictive_from_samples(task: Task, outputs: np.ndarray) -> AnyPredictive:
    """The predictive of ``[S, N, ...]`` member outputs for ``task`` (what the exported head computes)."""
    return task.reduce(outputs)


def probs_entropy_mi(probs: Sequence[int], maps: Sequence[int] = ()) -> list[onnx.ValueInfoProto]:
    """The value infos of the outputs ``probs`` [batch, *probs] and ``entropy``, ``mutual_info`` [batch, *maps]
    (float32), for :meth:`Task.output_infos`."""
    return [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", *probs]),
            helper.make_tensor_value_info("entropy", TensorProto.FLOAT, ["batch", *maps]),
            helper.make_tensor_value_info("mutual_info", TensorProto.FLOAT, ["batch", *maps])]
