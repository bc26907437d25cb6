"""The ``edgebnn`` command line.

Errors a user can cause print one line naming the file, layer or option and exit with status 2;
``edgebnn --debug ...`` shows the traceback instead. Every ``--json`` report carries ``schema`` and
``edgebnn_version``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from edgebnn._version import __version__
from edgebnn.cli._paths import DATA_KEYWORDS, GuardedCommand, InputPath
from edgebnn.errors import EdgeBNNError, InvalidOptionError
from edgebnn.tables import fmt_bytes
from edgebnn.tables import write_json as write_report

console = Console()
err_console = Console(stderr=True)


class _Command(GuardedCommand):
    """A command that loads the plug-ins when it runs (after its options parsed): ``COMMAND --help`` ends while
    parsing, before any plug-in is imported, so help imports neither the families nor a plug-in's torch."""

    def invoke(self, ctx: click.Context) -> Any:
        from edgebnn.plugins import load

        load((ctx.find_object(dict) or {}).get("plugins", ()))
        return super().invoke(ctx)


class _Group(click.Group):
    """Turns EdgeBNNError, and a command line click cannot parse, into one line on stderr and exit status 2."""

    command_class = _Command  # every command loads the plug-ins and checks its input and output paths, then runs

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:  # a missing or unknown option: one line, not click's usage block
            if e.ctx is None or e.ctx.command is self:
                raise
            where = e.ctx.command_path.replace(e.ctx.find_root().info_name or "edgebnn", "edgebnn", 1)
            err_console.print(f"[bold red]error:[/] {escape(e.format_message())} (see {escape(where)} --help)",
                              highlight=False, soft_wrap=True, emoji=False)
            sys.exit(2)
        except EdgeBNNError as e:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            # The message may hold user text (paths, names): never interpret it as rich markup or emoji.
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True, emoji=False)
            sys.exit(2)
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]: no artifact was written or changed")
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="edgebnn")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Load a plug-in module (a posterior family, a task) before the command, e.g. --plugin my_family "
                   "(repeatable; also EDGEBNN_PLUGINS=mod1,mod2). Installed packages with an 'edgebnn.plugins' "
                   "entry point load by themselves; 'edgebnn plugins' lists what is loaded.")
@click.pass_context
def main(ctx: click.Context, debug: bool, plugins: tuple[str, ...]) -> None:
    """edgebnn: compile a trained Bayesian neural network into an on-device predictive ensemble.

    \b
    Typical flow:
      edgebnn demo --out demo-out                      # everything below, on sklearn digits
      edgebnn lower --model edgebnn.models:digits_cnn --weights w.safetensors \\
                    --input-shape 1,1,8,8 -o model.ebnn     # import a trained BNN into the IR
      edgebnn inspect model.ebnn                       # layers, encodings, sizes
      edgebnn export model.ebnn --target onnx --samples 16 -o model.onnx
      edgebnn eval model.onnx --data digits            # accuracy, NLL, ECE, Brier
      edgebnn eval model.onnx --data test.npz --ood-data ood.npz   # your data; OOD detection
      edgebnn profile model.ebnn --device cpu --samples 16   # vs float baselines
      edgebnn plugins                                  # posterior families and tasks loaded (docs/extending.md)
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    # the package's families, entry points, $EDGEBNN_PLUGINS, --plugin (one line if one fails): loaded by the
    # command when it runs (:class:`_Command`), so that COMMAND --help imports none of them
    ctx.obj["plugins"] = plugins


# -- helpers ----------------------------------------------------------------------------------------------


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError as e:
        raise InvalidOptionError(f"--input-shape {text}: expected comma-separated ints like 1,1,8,8") from e
    if len(shape) < 2 or any(d <= 0 for d in shape):
        raise InvalidOptionError(f"--input-shape {text}: expected batch,dims... of positive ints like 1,1,8,8")
    return shape


def _parse_hoist(text: str) -> str | float:
    if text in ("auto", "off"):
        return text
    try:
        value = float(text)
    except ValueError as e:
        raise InvalidOptionError(f"--hoist {text}: use auto, off or a non-negative sigma") from e
    if not value >= 0:
        raise InvalidOptionError(f"--hoist {text}: use auto, off or a non-negative sigma")
    return value


DATA = InputPath(keywords=DATA_KEYWORDS, dir_okay=True)  # --data digits, a file or a folder of shards
DATA_HELP = ("'digits' (the built-in set; --split picks the part), an .npz with x (N, ...) float32 inputs and y (N,) "
             "integer labels, or a folder of .npy/.npz shards (x_000.npy + y_000.npy, or .npz with x and y), "
             "streamed in batches. Inputs must be preprocessed as the model expects.")
SPLIT_HELP = "digits split (default: test); for --data digits only."


BAR_GRACE_S = 2.0  # a terminal's bar appears once a step has run this long: a quick step shows none


@contextlib.contextmanager
def _progress_bar(description: str, *, unit: str = "steps") -> Iterator[Callable[[int, int], None]]:
    """A transient rich progress bar on stderr, shown once the step has run :data:`BAR_GRACE_S`; yields
    ``update(done, total)`` (``unit="bytes"``: done and total are bytes, shown as sizes). Where stderr is not a
    terminal (a pipe, a log, CI) it prints lines instead (:class:`_ProgressLines`)."""
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if not err_console.is_terminal:
        with _ProgressLines.around(description, unit) as lines:
            yield lines.update
        return
    count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), count, TimeRemainingColumn(), console=err_console,
                   transient=True)
    task = bar.add_task(escape(description), total=None)
    shows = threading.Timer(BAR_GRACE_S, bar.start)
    shows.daemon = True
    shows.start()
    try:
        yield lambda done, total: bar.update(task, completed=done, total=total)
    finally:
        shows.cancel()
        shows.join()
        bar.stop()


@contextlib.contextmanager
def _status(description: str) -> Iterator[Callable[[str], None]]:
    """A rich spinner on stdout, ``description: text`` after each ``update(text)``; where stdout is not a terminal,
    one line on stderr per update (:class:`_ProgressLines`)."""
    if not console.is_terminal:
        with _ProgressLines.around(description) as lines:
            yield lines.say
        return
    with console.status(escape(description)) as status:
        yield lambda text: status.update(escape(f"{description}: {text}"))


class _ProgressLines:
    """Progress for a log (stderr not a terminal) of a step that runs past :attr:`GRACE_S`: a line when it does,
    then one each time ``done`` passes another tenth of ``total`` (or the total changes: a new phase) or a step is
    named, and a done line, each with the elapsed time. A shorter step prints nothing, so a command that fails
    early still prints its error alone, in one line."""

    STEPS = 10  # lines per phase at most, besides the first and the done lines
    GRACE_S = 10.0  # a step shorter than this prints no progress

    def __init__(self, description: str, unit: str = "steps") -> None:
        self.description, self.unit = description, unit
        self.start = time.monotonic()
        self.total: int | None = None
        self.next = 0  # the next tenth of total that prints a line
        self.printed = False

    @classmethod
    @contextlib.contextmanager
    def around(cls, description: str, unit: str = "steps") -> Iterator[_ProgressLines]:
        """Yield the lines; the done line after the block where any line was printed (none after an error)."""
        lines = cls(description, unit)
        yield lines
        if lines.printed:
            lines._print(f"done in {lines._elapsed()}")

    def update(self, done: int, total: int) -> None:
        if total != self.total:
            self.total, self.next = total, 0
        if total > 0 and done * self.STEPS >= self.next * total:
            self.next = done * self.STEPS // total + 1
            of = f"{fmt_bytes(done)} of {fmt_bytes(total)}" if self.unit == "bytes" else f"{done}/{total}"
            self._line(f"{of} ({self._elapsed()})")

    def say(self, text: str) -> None:
        self._line(f"{text} ({self._elapsed()})")

    def _line(self, text: str) -> None:
        if not self.printed:
            if time.monotonic() - self.start < self.GRACE_S:
                return
            self.printed = True
            self._print(f"running for {self._elapsed()}")
        self._print(text)

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.start:.1f} s"

    def _print(self, text: str) -> None:
        err_console.print(f"{self.description}: {text}", highlight=False, markup=False, soft_wrap=True)


def write_json(path: str | Path | None, report: dict[str, Any], schema: str) -> None:
    """Write ``report`` with ``schema`` and ``edgebnn_version`` atomically (no-op without a path)."""
    write_report(console, path, report, schema)


def _check_output_dir(path: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InvalidOptionError(f"-o {path}: directory {parent} does not exist")
