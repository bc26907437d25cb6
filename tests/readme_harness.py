"""Read a Markdown file's commands and Python snippets the way a reader copies them (the README and guides are tests).

:func:`steps` walks the fenced blocks in order: a ```python block is one snippet; any other block gives its command
lines (``edgebnn ...``, ``make ...``, ``.venv/bin/python SCRIPT ...``, ``pip ...``), a line ending in ``\\`` joined
with the next, and the ``# ...`` comments after a command (on its lines or on the comment lines below it) kept
apart. Sections are the ``## `` headings; what comes before the first one belongs to the first.

:func:`fill` turns a command as written into what a reader types:

* ``[...]``: the optional parts are typed too (they are what the line documents), except the options in
  :data:`HARDWARE_OPTIONS` (an ssh session to a board), whose group is left out and recorded;
* ``a|b|c``: the first choice;
* ``...``: the options of the command above that say which model it is (``lower``: ``--model``, ``--weights``,
  ``--input-shape``), as a reader copies them;
* :data:`SMALL`: options set smaller so a test runs in seconds (profile runs, search trials), each with its reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^\s*```\s*([\w-]*)\s*$")
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(edgebnn|make|pip|python3?|\.venv/bin/python)(\s|$)")
"""A command line: its word, after any ``NAME=value`` environment settings (``PYTHONPATH=$PWD .venv/bin/python``)."""
GROUP_OPTIONS = {"--plugin": True, "--debug": False, "--version": False}
"""``edgebnn`` options before the command, and whether each takes a value."""
CHOICE = re.compile(r"^[\w.+/-]+(\|[\w.+/-]+)+$")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
INHERITED = {"lower": ("--model", "--weights", "--input-shape")}
"""``...`` in a command: these options of the last command of the same kind that gave them."""
HARDWARE_OPTIONS = {"--remote": "runs the profile over ssh on a Jetson board"}
"""Optional groups left out, and why (the command itself still runs)."""
SMALL: dict[str, dict[str, str]] = {
    "profile": {"--runs": "20", "--warmup": "2"},  # 200 timed runs per graph: a figure, not a test
    "search": {"--trials": "4", "--population": "4", "--runs": "2", "--warmup": "1"},  # 24 trials take minutes
    "demo": {"--runs": "20"},  # the demo's profile: its timing, not what the test checks
}
"""Options a test sets smaller than the README, per command: the command and its outputs stay the same kind."""


@dataclass
class Step:
    """One command (``kind`` shell) or Python snippet (``kind`` python) of a Markdown file, in reading order."""

    doc: str
    line: int
    section: str
    kind: str
    text: str
    comment: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def sub_index(argv: list[str]) -> int:
    """Where the subcommand is in an ``edgebnn`` argv (after the group's options: ``edgebnn --plugin m lower``)."""
    i = 1
    while i < len(argv) and argv[i] in GROUP_OPTIONS:
        i += 2 if GROUP_OPTIONS[argv[i]] else 1
    return i


@dataclass
class Filled:
    """A command as a reader types it: the environment it sets, and its words from the command word on."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # optional groups not typed (HARDWARE_OPTIONS)
    smaller: list[str] = field(default_factory=list)  # options SMALL changed


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: the comment starts at a ``#`` after a blank, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def steps(path: Path, doc: str | None = None) -> list[Step]:
    """The commands and snippets of the fenced blocks of ``path``, in order; ``doc``: the page's name in
    :attr:`Step.where` (default the file name)."""
    doc = doc or path.name
    lines = path.read_text().splitlines()
    out: list[Step] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            if not section:  # what came before the first heading belongs to the first section
                for step in out:
                    step.section = line[3:].strip()
            section = line[3:].strip()
        fence = FENCE.match(line)
        if not fence:
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        end = next(j for j in range(start, len(lines)) if FENCE.match(lines[j]))
        body = lines[start:end]
        if lang == "python":
            out.append(Step(doc, start + 1, section, "python", "\n".join(body)))
        else:
            out += _commands(doc, start, section, body)
        i = end + 1
    return out


def _commands(doc: str, start: int, section: str, body: list[str]) -> list[Step]:
    found: list[Step] = []
    current: Step | None = None
    continued = False
    for k, raw in enumerate(body):
        code, comment = split_comment(raw)
        text = code.strip()
        if continued and current is not None:
            current.text += " " + text.rstrip("\\").strip()
            current.comment = " ".join(filter(None, [current.comment, comment]))
            continued = text.endswith("\\")
            continue
        if COMMAND.match(text):
            current = Step(doc, start + k + 1, section, "shell", text.rstrip("\\").strip(), comment)
            found.append(current)
            continued = text.endswith("\\")
        elif not text and comment and current is not None:  # a comment line below a command: about it
            current.comment = " ".join(filter(None, [current.comment, comment]))
        elif text:
            current = None  # a line of something else (a diagram, output): what follows is not about a command
    return found


def words(step: Step) -> list[str]:
    """The command's words (shell quoting removed)."""
    return shlex.split(step.text)


def fill(step: Step, previous: dict[str, list[str]]) -> Filled:
    """``step`` as a reader types it (module docstring); ``previous``: per command, the last filled argv."""
    tokens = words(step)
    filled = Filled([])
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        filled.env[name] = value
    depth, group, skip = 0, [], False
    for tok in tokens:
        if not depth and tok.startswith("["):
            depth, tok = 1, tok[1:]
            group, skip = [], False
        closing = bool(depth) and tok.count("]") > tok.count("[")  # a bracket JSON value is balanced
        if closing:
            tok = tok[:-1]
        if depth:
            if tok in HARDWARE_OPTIONS:
                skip = True
            group.append(tok)
            if closing:
                depth -= 1
                if skip:
                    filled.left_out.append(" ".join(group))
                else:
                    filled.argv += [_choice(t) for t in group]
            continue
        filled.argv.append(_choice(tok))
    argv = filled.argv
    sub = sub_index(argv) if argv and argv[0] == "edgebnn" else 1
    if "..." in argv:
        command = argv[sub] if len(argv) > sub else ""
        inherit = []
        before = previous.get(command, [])
        for opt in INHERITED.get(command, ()):
            if opt in before:
                inherit += [opt, before[before.index(opt) + 1]]
        at = argv.index("...")
        filled.argv = argv = argv[:at] + inherit + argv[at + 1 :]
    if argv and argv[0] == "edgebnn" and len(argv) > sub:
        for opt, value in SMALL.get(argv[sub], {}).items():
            if opt in argv:
                argv[argv.index(opt) + 1] = value
            else:
                argv += [opt, value]
            filled.smaller.append(f"{opt} {value}")
    return filled


def _choice(token: str) -> str:
    return token.split("|")[0] if CHOICE.match(token) else token


def options_in(text: str) -> list[str]:
    """The ``--options`` a comment or a bracket names, with the ``edgebnn COMMAND`` each belongs to when the text
    names one (``(edgebnn lower without --scheme)``): [(command or None, option)]."""
    found = []
    owner = None
    for m in re.finditer(r"edgebnn ([a-z]+)|(?<![\w-])(--[a-z][a-z0-9-]*)", text):
        if m.group(1):
            owner = m.group(1)
        else:
            found.append((owner, m.group(2)))
    return found  # type: ignore[return-value]
