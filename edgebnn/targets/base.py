"""A target: one kind of device (cpu, rtx, jetson) that compiles ONNX graphs and runs them.

Each kind is one :class:`Target` subclass (:mod:`edgebnn.targets.cpu`, :mod:`edgebnn.targets.gpu`), found by
device profile name through :func:`edgebnn.targets.registry.get_target`. A target knows

* which runtimes it has (``runtimes``; the first is its default) and how to :meth:`~Target.compile` a graph
  into an :class:`Executable` for one of them, or :meth:`~Target.load` an artifact compiled earlier;
* the float baselines every profile measures (:meth:`~Target.baselines`, graphs the exporters build) and
  which runtime runs each (:meth:`~Target.plan`);
* its default export mode (:meth:`~Target.default_mode`) and its power meters (:meth:`~Target.open_meter`).

The public methods validate options against what the device supports (a runtime it lacks, weights in a
precision it cannot execute, a DLA core it does not have) with one-line errors naming the device, then call
the private ``_compile``/``_load`` of the kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx

from edgebnn.devices import BASELINE_RUNNERS, DeviceProfile
from edgebnn.errors import InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters.metadata import EXPORT_KEY, ExportMetadata, load_onnx
from edgebnn.exporters.tensorrt import DEFAULT_WORKSPACE_MIB
from edgebnn.ir import BNNModel
from edgebnn.runtime.session import read_export
from edgebnn.targets.power import DEFAULT_IDLE_S, PowerMeter, open_meter
from edgebnn.targets.runners import Feed, Runner

BASELINES = ("float_deterministic", "float_bnn")
"""The float baselines of every profile: the posterior-mean network (one pass) and the Gaussian network
(one sampled pass; a profile runs S of them per inference, as bayesian-torch does)."""

Runtimes = str | tuple[str, ...]
"""A runtime name, or runtimes to try in order (the first that is installed here compiles the graph)."""


@dataclass(frozen=True)
class CompileOptions:
    """How :meth:`Target.compile` builds an executable; each kind reads the fields that concern it.

    Attributes:
        name: Stem of the files a build writes (``<name>.onnx``, ``<name>.engine``) and the graph's name in
            messages.
        workdir: Folder for those files; None: beside the ONNX file when compiling a path.
        threads: CPU threads of onnxruntime/torch.
        max_batch: Largest batch a TensorRT engine accepts.
        workspace_mib: TensorRT builder workspace.
        dla_core: DLA core a TensorRT engine runs on (GPU fallback on), None for the GPU.
    """

    name: str = "model"
    workdir: str | Path | None = None
    threads: int = 2
    max_batch: int = 1
    workspace_mib: int = DEFAULT_WORKSPACE_MIB
    dla_core: int | None = None

    def __post_init__(self) -> None:
        for option, value, least in (("threads", self.threads, 0), ("max batch", self.max_batch, 1),
                                     ("workspace", self.workspace_mib, 1)):
            if value < least:
                raise InvalidOptionError(f"{option} must be at least {least}, got {value}")


@dataclass(frozen=True)
class Executable:
    """A graph compiled for one target.

    Attributes:
        runner: What runs it (:mod:`edgebnn.targets.runners`).
        target: Device profile name it was compiled for.
        meta: The graph's edgebnn export metadata (``mode``, ``samples``, ``weights``, ...); None when the
            graph carries none.
        size_bytes: Size of what runs: the serialized ONNX, or the engine file.
    """

    runner: Runner
    target: str
    meta: ExportMetadata | None
    size_bytes: int

    @property
    def name(self) -> str:
        """Runtime name: ``onnxruntime``, ``torch`` or ``tensorrt``."""
        return self.runner.name

    @property
    def provider(self) -> str:
        """What executes it, e.g. ``CPUExecutionProvider``, ``cuda:0``, ``TensorRT 10.3.0 (GPU)``."""
        return self.runner.provider

    @property
    def input_names(self) -> list[str]:
        """Names of the inputs :meth:`run` takes."""
        return self.runner.input_names

    def run(self, inputs: Feed) -> list[np.ndarray]:
        """One inference, host arrays in and out (outputs in graph order)."""
        return self.runner.run(inputs)

    def bind(self, inputs: Feed) -> Callable[[], Any]:
        """Stage ``inputs`` on the device; the returned call runs one inference and returns when it finished."""
        return self.runner.bind(inputs)


def _graph(model: onnx.ModelProto | str | Path, name: str) -> tuple[onnx.ModelProto, Path | None, str]:
    """(model, its file or None, name for messages)."""
    if isinstance(model, onnx.ModelProto):
        return model, None, name
    path = Path(model)
    if not path.is_file():
        raise InvalidArtifactError(f"{path}: ONNX model not found")
    proto, _, where = load_onnx(path)  # external data (an export past 2 GiB) stays in its file for onnxruntime
    return proto, path, where


def onnx_size(proto: onnx.ModelProto, path: Path | None) -> int:
    """Bytes of a graph: its file (and its external data), or its serialized size."""
    return load_onnx(path)[1] if path is not None else proto.ByteSize()


def _export_meta(proto: onnx.ModelProto) -> ExportMetadata | None:
    """The edgebnn export metadata of a graph, or None for a graph edgebnn did not export."""
    if not any(p.key == EXPORT_KEY for p in proto.metadata_props):
        return None
    return read_export(proto)[1]


class Target(ABC):
    """One kind of device; an instance is that kind bound to one device profile.

    Args:
        profile: The device profile (:func:`edgebnn.devices.get_device`).
    """

    kind: ClassVar[str]
    runtimes: ClassVar[tuple[str, ...]]
    """Runtimes :meth:`compile` accepts here; the first is the default (the one ensembles run on)."""

    def __init__(self, profile: DeviceProfile) -> None:
        if profile.kind != self.kind:
            raise InvalidOptionError(f"device {profile.name} is a {profile.kind} device, not {self.kind}")
        self.profile = profile

    @property
    def name(self) -> str:
        """The canonical device profile name (``jetson-orin-nano``, never an alias)."""
        return self.profile.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- compile and load -------------------------------------------------------------------------------

    def compile(self, model: onnx.ModelProto | str | Path, *, runtime: Runtimes | None = None,
                options: CompileOptions | None = None) -> Executable:
        """Compile an ONNX graph for this device.

        Args:
            model: The graph, or the path of an ONNX file.
            runtime: One of :attr:`runtimes` (None: the default), or several to try in order: the first whose
                software is installed here compiles it.
            options: Build options (threads, TensorRT batch/workspace/DLA core, where files go).

        Returns:
            The executable.

        Raises:
            InvalidOptionError: A runtime, weight precision or DLA core this device does not have.
            InvalidArtifactError: An unreadable model, or one the runtime refuses.
            MissingDependencyError: None of the runtimes is installed here (each one's reason is listed).
        """
        options = options or CompileOptions()
        proto, path, where = _graph(model, options.name)
        meta = _export_meta(proto)
        candidates = (runtime or self.runtimes[0],) if isinstance(runtime, str | None) else tuple(runtime)
        if not candidates:
            raise InvalidOptionError(f"{where}: no runtime given; {self.name} runs {', '.join(self.runtimes)}")
        for rt in candidates:
            if rt not in self.runtimes:
                raise InvalidOptionError(f"{where}: runtime {rt!r} is not available on {self.name}, which runs "
                                         f"{', '.join(self.runtimes)}")
            self._check(meta, rt, where)
        for key, what in (("weights", "weights"), ("precision", "activations")):  # export --weights, calibrate
            value = getattr(meta, key) if meta is not None else None
            if value is not None and value not in self.profile.precisions:
                raise InvalidOptionError(f"{where}: {value} {what} do not run on {self.name}, which takes "
                                         f"{', '.join(self.profile.precisions)}")
        if options.dla_core is not None and not 0 <= options.dla_core < self.profile.dla_cores:
            cores = f"cores 0-{self.profile.dla_cores - 1}" if self.profile.dla_cores else "no DLA cores"
            raise InvalidOptionError(f"DLA core {options.dla_core}: {self.name} has {cores}")
        missing: list[str] = []
        for rt in candidates:
            try:
                runner, size = self._compile(proto, path, meta, rt, options)
            except MissingDependencyError as e:  # noqa: PERF203 (a runtime or two, each tried once)
                if len(candidates) == 1:
                    raise
                missing.append(str(e))
            else:
                return Executable(runner, self.name, meta, size)
        raise MissingDependencyError(f"{where} on {self.name} needs one of {', '.join(candidates)}: "
                                     f"{'; '.join(missing)}")

    @abstractmethod
    def _check(self, meta: ExportMetadata | None, runtime: str, where: str) -> None:
        """Refuse a graph (by its export metadata) that ``runtime`` cannot run on this kind of device."""

    @abstractmethod
    def _compile(self, proto: onnx.ModelProto, path: Path | None, meta: ExportMetadata | None, runtime: str,
                 options: CompileOptions) -> tuple[Runner, int]:
        """(runner, size in bytes of what it runs) for a validated graph."""

    def load(self, artifact: str | Path, *, samples: int | None = None) -> Executable:
        """An artifact compiled earlier (a TensorRT engine with its build manifest beside it).

        Args:
            artifact: The compiled file.
            samples: Ensemble size S it must have been exported with, when known.

        Raises:
            InvalidOptionError: This kind of device runs no compiled artifacts, or ``samples`` differs.
            InvalidArtifactError: The artifact does not match its manifest, the installed runtime or the device.
        """
        return self._load(Path(artifact), samples)

    @abstractmethod
    def _load(self, artifact: Path, samples: int | None) -> Executable:
        """Load a compiled artifact."""

    # -- what a profile measures ------------------------------------------------------------------------

    def baselines(self, model: BNNModel) -> dict[str, onnx.ModelProto]:
        """The float baselines of ``model`` (:data:`BASELINES`), as the exporters build them."""
        from edgebnn.exporters.ensemble import float_bnn, float_deterministic

        return {"float_deterministic": float_deterministic(model), "float_bnn": float_bnn(model)}

    def plan(self, baseline_runner: str = "auto") -> dict[str, Runtimes]:
        """The runtime(s) each baseline compiles for.

        Args:
            baseline_runner: ``auto`` (this device's pick), ``onnxruntime`` or ``torch`` (both baselines there).

        Raises:
            InvalidOptionError: Another choice.
        """
        if baseline_runner not in BASELINE_RUNNERS:
            raise InvalidOptionError(f"--baseline-runner {baseline_runner}: choose one of "
                                     f"{', '.join(BASELINE_RUNNERS)}")
        if baseline_runner == "auto":
            return self._auto_plan()
        return dict.fromkeys(BASELINES, baseline_runner)

    @abstractmethod
    def _auto_plan(self) -> dict[str, Runtimes]:
        """Runtime(s) of each baseline when the user leaves the choice to the target."""

    @abstractmethod
    def default_mode(self, *, samples: int | None = None, batch: int | None = None,
                     bench_results: str | Path | None = None) -> tuple[str, str]:
        """``(mode, reason)``: the export mode an ensemble gets here when none is given."""

    @property
    def power_meters(self) -> tuple[str, ...]:
        """Meter names tried in this order when none is given (:mod:`edgebnn.targets.power`)."""
        return self.profile.power_meters

    def open_meter(self, name: str | None = None, *, idle_s: float = DEFAULT_IDLE_S,
                   settings: Mapping[str, Mapping[str, Any]] | None = None) -> PowerMeter:
        """A power meter by name, or the first of :attr:`power_meters` that works here (else a null meter)."""
        return open_meter(name, self.name, idle_s=idle_s, settings=settings)

