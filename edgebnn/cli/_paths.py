"""The files a command reads and writes: nothing a user gives is lost.

An option that reads a file is typed :class:`InputPath`, one that writes a file :class:`OutputPath` (with the
kind of file it writes and, for a TensorRT engine, the companion files written beside it). Every command of
``edgebnn`` is a :class:`GuardedCommand`, which checks them before the command does any work, and refuses in one
line (exit 2, nothing read beyond the paths, nothing written):

* an output whose extension belongs to another of edgebnn's formats: ``lower -o x.onnx`` (an IR is ``.ebnn``),
  ``export -o x.ebnn``, ``export --target tensorrt -o x.onnx`` (an engine: its ONNX goes beside it),
  ``--json x.onnx``, ...; an extension edgebnn does not know is the user's choice;
* an output (or a companion of it) that resolves to one of the command's inputs: the same path, a hard link
  or a symbolic link to it, or a data file inside an input folder of shards;
* two outputs of one command at one path;
* an input of another kind than the option reads, where the right command can be named (``--onnx model.ebnn``,
  ``--engine model.engine.onnx``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from edgebnn.errors import InvalidOptionError

# edgebnn's file kinds by extension: an output of one kind with another's extension is refused
FORMATS: dict[str, str] = {
    ".ebnn": "ebnn", ".onnx": "onnx", ".engine": "engine", ".plan": "engine", ".json": "json", ".jsonl": "json",
    ".png": "png", ".safetensors": "weights", ".pt": "weights", ".pth": "weights", ".npz": "data", ".npy": "data",
}
WHAT: dict[str, str] = {
    "ebnn": "an .ebnn IR", "onnx": "an ONNX export", "engine": "a TensorRT engine", "json": "a JSON report",
    "png": "a PNG image", "weights": "trained weights", "data": "a data file",
}
EXTENSION: dict[str, str] = {"ebnn": ".ebnn", "onnx": ".onnx", "engine": ".engine", "json": ".json", "png": ".png"}
DATA_KEYWORDS = ("digits",)  # --data digits: the built-in set, not a path

Companions = Callable[[str, Mapping[str, Any]], list[str]]


class InputPath(click.Path):
    """A file (or, with ``dir_okay``, a folder of shards) the command reads.

    Args:
        wrong: Extension -> what to say when the file has it (the option reads another kind), e.g.
            ``{".ebnn": "an .ebnn IR, not an export: ..."}``, or ``message(path)``; it follows ``OPTION PATH: ``.
        keywords: Values that name no file (``digits``).
    """

    def __init__(self, *, wrong: Mapping[str, str | Callable[[str], str]] | None = None,
                 keywords: tuple[str, ...] = (), dir_okay: bool = False) -> None:
        super().__init__(dir_okay=dir_okay)
        self.wrong = dict(wrong or {})
        self.keywords = keywords

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value in self.keywords:
            return value
        return super().convert(value, param, ctx)


class OutputPath(click.Path):
    """A file the command writes.

    Args:
        kind: What it writes (a key of :data:`WHAT`), or ``kind(params)`` when another option decides it.
        companions: ``companions(path, params)``: the other files written beside it, named after it.
        hint: Said after the extension refusal (how to name it, where the rest goes).
    """

    def __init__(self, kind: str | Callable[[Mapping[str, Any]], str], *, companions: Companions | None = None,
                 hint: str | Callable[[str, Mapping[str, Any]], str] = "") -> None:
        super().__init__(dir_okay=False)
        self.kind = kind
        self.companions = companions
        self.hint = hint


@dataclass(frozen=True)
class _Path:
    label: str  # "-o", "--json", "MODEL"
    path: str


def _label(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return min(param.opts, key=len) if param.opts else f"--{param.name}"
    return (param.name or "path").upper()


def _values(value: Any) -> Iterator[str]:
    if value is None:
        return
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _values(v)
    else:
        yield str(value)


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file: the same resolved path, or (both existing) the same inode."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return Path(a).resolve() == Path(b).resolve()


def _inside(path: str, folder: str) -> bool:
    return Path(folder).is_dir() and Path(path).resolve().parent == Path(folder).resolve()


def check_paths(command: str, params: list[click.Parameter], values: Mapping[str, Any]) -> None:
    """Refuse (one :class:`InvalidOptionError`) what the module docstring lists, before the command runs."""
    inputs: list[_Path] = []
    outputs: list[tuple[_Path, str | None]] = []  # (output, the -o it is a companion of)
    typed: list[tuple[str, str, OutputPath]] = []
    for param in params:
        kind = param.type
        if isinstance(kind, InputPath):
            for path in _values(values.get(param.name or "")):
                if path in kind.keywords:
                    continue
                message = kind.wrong.get(Path(path).suffix.lower())
                if message:
                    text = message(path) if callable(message) else message
                    raise InvalidOptionError(f"{_label(param)} {path}: {text}")
                inputs.append(_Path(_label(param), path))
        elif isinstance(kind, OutputPath):
            for path in _values(values.get(param.name or "")):
                label = _label(param)
                typed.append((label, path, kind))
                outputs.append((_Path(label, path), None))
                if kind.companions is not None:
                    outputs += [(_Path(label, c), path) for c in kind.companions(path, values)]
    _check_collisions(command, inputs, outputs)
    for label, path, kind in typed:
        _check_extension(command, label, path, kind, values)


def _check_collisions(command: str, inputs: list[_Path], outputs: list[tuple[_Path, str | None]]) -> None:
    for i, (out, owner) in enumerate(outputs):
        what = f"{out.label} {owner}: its companion file {out.path}" if owner else f"{out.label} {out.path}"
        for inp in inputs:
            link = "" if os.path.abspath(out.path) == os.path.abspath(inp.path) else " (a link to the same file)"
            if _same(out.path, inp.path):
                raise InvalidOptionError(f"{what} is {inp.label} {inp.path}{link}, which {command} reads; writing "
                                         f"it would replace that file: give {out.label} another path")
            if Path(out.path).suffix.lower() in (".npz", ".npy") and _inside(out.path, inp.path):
                raise InvalidOptionError(f"{what} is inside {inp.label} {inp.path}, a folder {command} reads; give "
                                         f"{out.label} another path")
        for other, other_owner in outputs[:i]:
            if _same(out.path, other.path):
                first = f"{other.label} {other_owner or other.path}"
                raise InvalidOptionError(f"{what} and {first}: two of {command}'s outputs at one path; give each "
                                         "its own")


def _check_extension(command: str, label: str, path: str, kind: OutputPath, values: Mapping[str, Any]) -> None:
    want = kind.kind(values) if callable(kind.kind) else kind.kind
    got = FORMATS.get(Path(path).suffix.lower())
    if got is None or got == want:
        return
    suggestion = str(Path(path).with_suffix(EXTENSION[want])) if want in EXTENSION else None
    hint = kind.hint(path, values) if callable(kind.hint) else kind.hint
    fix = f"give {label} {suggestion}" if suggestion else f"give {label} another name"
    raise InvalidOptionError(f"{label} {path}: {command} writes {WHAT[want]} there, and {Path(path).suffix} is "
                             f"the extension of {WHAT[got]}; {fix}{hint}")


class GuardedCommand(click.Command):
    """A command whose :class:`InputPath` and :class:`OutputPath` options are checked before it runs."""

    def invoke(self, ctx: click.Context) -> Any:
        check_paths(self.name or "edgebnn", self.params, ctx.params)
        return super().invoke(ctx)
