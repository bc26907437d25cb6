"""The TensorRT targets: ``rtx`` (a desktop/laptop NVIDIA GPU, engines built by TensorRT for RTX) and ``jetson``
(Orin, TensorRT 10.3).

=================  ===================================================================
runtimes           ``tensorrt`` (default: an engine built here by :func:`edgebnn.exporters.tensorrt.build_engine`),
                   ``torch`` on CUDA, ``onnxruntime`` with its CUDA provider
ensemble           a TensorRT engine built from the exported ONNX, or one built earlier (:meth:`~TensorRTTarget.load`)
baselines          ``float_deterministic`` as a TensorRT engine built from the same IR; ``float_bnn`` in torch CUDA,
                   else onnxruntime CUDA (``auto``); or both on torch / onnxruntime (CUDA)
default mode       ``baked``
power meters       rtx: ``nvml``; jetson: ``ina3221``, ``tegrastats``, ``jtop``
=================  ===================================================================

``float_bnn`` never runs in TensorRT: it must draw new weights on every pass, and TensorRT imports random
ops as a Fill layer that ignores seeds (not reproducible, and whether it redraws per run is unverified: running an
engine needs a GPU with TensorRT), so the S sampled passes run where bayesian-torch users run them, in torch on the
GPU. For the same reason the ensemble is ``baked`` (or ``analytic``): a ``noise`` graph would take host-drawn
noise copied to the GPU on every call.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from edgebnn.errors import InvalidArtifactError, InvalidOptionError, MissingDependencyError
from edgebnn.exporters.metadata import ExportMetadata
from edgebnn.runtime.session import read_export
from edgebnn.targets.base import CompileOptions, Executable, Runtimes, Target, onnx_size
from edgebnn.targets.runners import OrtRunner, Runner, TensorRTRunner, TorchRunner, import_tensorrt


class TensorRTTarget(Target):
    """A device whose default runtime is TensorRT (see the module docstring)."""

    runtimes = ("tensorrt", "torch", "onnxruntime")

    def _check(self, meta: ExportMetadata | None, runtime: str, where: str) -> None:
        if runtime == "tensorrt" and meta is not None and meta.mode == "noise":
            raise InvalidOptionError(
                f"--mode noise on {self.name}: a noise graph takes host-drawn noise inputs, copied to the GPU "
                "on every call; profile --mode baked (or analytic) on TensorRT"
            )

    def _compile(self, proto: onnx.ModelProto, path: Path | None, meta: ExportMetadata | None, runtime: str,
                 options: CompileOptions) -> tuple[Runner, int]:
        if runtime == "torch":
            return TorchRunner(proto, device="cuda", threads=options.threads), onnx_size(proto, path)
        if runtime == "onnxruntime":
            return OrtRunner(proto, provider="cuda", threads=options.threads,
                             where=str(path) if path is not None else None), onnx_size(proto, path)
        self._tensorrt(building=True)  # fail first, with what to do, before writing or building anything
        from edgebnn.exporters.ensemble import save_onnx
        from edgebnn.exporters.tensorrt import BuildOptions, build_engine

        if options.workdir is not None:
            workdir = Path(options.workdir)
            onnx_path = path if path is not None else save_onnx(proto, workdir / f"{options.name}.onnx")
            engine = workdir / f"{options.name}.engine"
        elif path is not None:
            onnx_path, engine = path, path.with_name(path.stem + ".engine")
        else:
            raise InvalidOptionError(f"{options.name}: building a TensorRT engine of an in-memory graph needs a "
                                     "workdir for the engine file")
        build_engine(onnx_path, engine, self.name, BuildOptions(workspace_mib=options.workspace_mib,
                                                                dla_core=options.dla_core, max_batch=options.max_batch))
        runner = TensorRTRunner(engine, self.name)
        return runner, runner.engine_path.stat().st_size

    def _load(self, artifact: Path, samples: int | None) -> Executable:
        from edgebnn.exporters.tensorrt import read_engine_manifest

        read_engine_manifest(artifact, self.name)  # an engine for another device is named as such, TensorRT or not
        self._tensorrt(building=False)
        meta = _engine_export(artifact, samples)
        runner = TensorRTRunner(artifact, self.name)
        if len(runner.input_names) != 1:
            raise InvalidArtifactError(
                f"{runner.engine_path}: the engine takes {len(runner.input_names)} inputs "
                f"({', '.join(runner.input_names)}); profile a baked or analytic ensemble on TensorRT"
            )
        return Executable(runner, self.name, meta, artifact.stat().st_size)

    def _tensorrt(self, *, building: bool) -> None:
        """Import the device's TensorRT, or say what works instead (:meth:`without_tensorrt`)."""
        try:
            import_tensorrt(self.name)
        except MissingDependencyError as e:
            advice = self.without_tensorrt(building=building)
            if advice is None:
                raise
            raise MissingDependencyError(advice) from e

    def without_tensorrt(self, *, building: bool) -> str | None:
        """What to do where the device's TensorRT is missing (None: its install line says it)."""
        return None

    def _auto_plan(self) -> dict[str, Runtimes]:
        # float_bnn redraws its weights on every pass: torch CUDA, else onnxruntime CUDA (RandomNormal runs there)
        return {"float_deterministic": "tensorrt", "float_bnn": ("torch", "onnxruntime")}

    def default_mode(self, *, samples: int | None = None, batch: int | None = None,
                     bench_results: str | Path | None = None) -> tuple[str, str]:
        """Always ``baked``, whatever was measured on a CPU."""
        # TensorRT imports RandomNormal as a Fill layer that ignores its seed (whether it redraws per run is
        # undocumented) and DLA runs no random ops at all; a noise graph would need host-drawn noise copied
        # in per call. Baked samples are plain constants: deterministic, DLA-friendly, no transfers.
        return "baked", f"{self.kind}: TensorRT ignores RNG seeds and DLA has no random ops, so samples are baked"


class RtxTarget(TensorRTTarget):
    """A desktop/laptop NVIDIA RTX GPU, engines built ahead of time by TensorRT for RTX; energy through NVML."""

    kind = "rtx"


class JetsonTarget(TensorRTTarget):
    """A Jetson Orin module with TensorRT 10.3 (JetPack 6), DLA cores on NX/AGX; energy from the board's rails."""

    kind = "jetson"

    def without_tensorrt(self, *, building: bool) -> str | None:
        """A Jetson engine is built and run by the board's own TensorRT (JetPack's): no other machine can, so the
        line gives the board's commands (the dry run's trtexec command, ``--engine``) and ``--remote``."""
        name = self.name
        board = (f"edgebnn profile MODEL.ebnn --device {name} --engine model.engine there (with JetPack's tensorrt in "
                 "its Python: a venv with --system-site-packages), or run this command from here with --remote "
                 "USER@BOARD")
        if not building:
            return f"no TensorRT here to run a {name} engine: it runs on the board: {board}"
        return (f"no TensorRT here to build a {name} engine, and only the board's own TensorRT (JetPack) builds "
                f"one: write the build with edgebnn export MODEL.ebnn --target tensorrt --device {name} --dry-run "
                "-o model.engine, run the trtexec command in model.engine.trtexec.txt on the board, then "
                f"{board}")


def _engine_export(engine: Path, samples: int | None) -> ExportMetadata | None:
    """The edgebnn export metadata of the ONNX an engine was built from (named in its manifest), if beside it."""
    from edgebnn.exporters.tensorrt import manifest_path

    try:
        manifest = json.loads(manifest_path(engine).read_text())
    except (OSError, json.JSONDecodeError):
        return None  # check_engine reports a bad manifest with the right message
    onnx_file = engine.parent / str(manifest.get("onnx", ""))
    if not manifest.get("onnx") or not onnx_file.is_file():
        return None
    meta = read_export(onnx_file)[1]
    if samples is not None and meta.samples != samples:
        raise InvalidOptionError(f"{engine}: built from an S={meta.samples} ensemble ({onnx_file.name}); "
                                 f"pass --samples {meta.samples}")
    return meta
