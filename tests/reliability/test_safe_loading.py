"""Safe loading everywhere: the package never unpickles, never ``torch.load``s without ``weights_only=True``,
never ``np.load``s with ``allow_pickle`` on, and never calls the builtin ``eval`` / ``exec``.

An ``ast`` scan of every source file of edgebnn, exporters, targets and calib (aliases resolved, so
``import pickle as p`` or ``from torch import load`` are seen through); the scanner is itself tested on
planted bad snippets, and on safe look-alikes (``model.eval()``) that it must let pass.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("edgebnn",)
UNSAFE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
TORCH_LOADS = {"torch.load", "torch.serialization.load"}
NUMPY_LOADS = {"numpy.load"}
BUILTIN_CODE_RUNNERS = {"eval", "exec"}


@dataclass(frozen=True)
class Finding:
    where: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.what}"


class _Scanner(ast.NodeVisitor):
    def __init__(self, where: str) -> None:
        self.where = where
        self.aliases: dict[str, str] = {}  # local name -> dotted origin ("np" -> "numpy")
        self.findings: list[Finding] = []

    def flag(self, node: ast.AST, what: str) -> None:
        self.findings.append(Finding(self.where, getattr(node, "lineno", 0), what))

    # -- imports -------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.split(".")[0] in UNSAFE_MODULES:
                self.flag(node, f"imports {a.name}")
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                root = a.name.split(".")[0]
                self.aliases[root] = root

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in UNSAFE_MODULES:
            self.flag(node, f"imports from {module}")
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{module}.{a.name}" if module else a.name

    # -- calls ---------------------------------------------------------------------------------------
    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        name = self.resolve(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        splat = None in keywords  # **kwargs: cannot be checked
        runs_code = name in BUILTIN_CODE_RUNNERS or name in {f"builtins.{n}" for n in BUILTIN_CODE_RUNNERS}
        if runs_code or (name and name.split(".")[0] in UNSAFE_MODULES):
            self.flag(node, f"calls {name}()")
        elif name in TORCH_LOADS:
            value = keywords.get("weights_only")
            if splat or not (isinstance(value, ast.Constant) and value.value is True):
                self.flag(node, f"calls {name}() without weights_only=True")
        elif name in NUMPY_LOADS:
            value = keywords.get("allow_pickle")
            if splat or (value is not None and not (isinstance(value, ast.Constant) and value.value is False)):
                self.flag(node, f"calls {name}() with allow_pickle not False")
        elif name in {"__import__", "importlib.import_module"} and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and str(arg.value).split(".")[0] in UNSAFE_MODULES:
                self.flag(node, f"imports {arg.value} dynamically")
        self.generic_visit(node)


def scan_source(source: str, where: str = "<string>") -> list[Finding]:
    scanner = _Scanner(where)
    scanner.visit(ast.parse(source, filename=where))
    return scanner.findings


def package_sources() -> list[Path]:
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20, f"found only {len(files)} source files under {SCANNED}"
    return files


def test_package_has_no_unsafe_loading():
    findings = [f for path in package_sources()
                for f in scan_source(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not findings, "\n".join(map(str, findings))


def test_checkpoint_loader_uses_weights_only():
    """The one place that reads .pt files does so with weights_only=True (and the scanner sees that call)."""
    src = (ROOT / "edgebnn" / "importers" / "checkpoint.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    loads = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "load" and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]
    assert len(loads) == 1
    assert any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in loads[0].keywords)


BAD = {
    "import pickle": "import pickle\n",
    "import pickle as alias": "import pickle as p\np.loads(b'')\n",
    "from pickle import loads": "from pickle import loads\n",
    "cPickle/_pickle": "import _pickle\n",
    "dill": "import dill\n",
    "shelve": "import shelve\n",
    "marshal": "from marshal import loads\n",
    "dynamic import": "__import__('pickle')\n",
    "importlib pickle": "import importlib\nimportlib.import_module('pickle')\n",
    "torch.load bare": "import torch\ntorch.load('w.pt')\n",
    "torch.load weights_only=False": "import torch\ntorch.load('w.pt', weights_only=False)\n",
    "torch.load weights_only variable": "import torch\nflag = True\ntorch.load('w.pt', weights_only=flag)\n",
    "torch.load **kwargs": "import torch\ntorch.load('w.pt', **{'weights_only': True})\n",
    "torch aliased": "import torch as T\nT.load('w.pt')\n",
    "from torch import load": "from torch import load\nload('w.pt')\n",
    "torch.serialization.load": "import torch.serialization\ntorch.serialization.load('w.pt')\n",
    "np.load allow_pickle=True": "import numpy as np\nnp.load('a.npy', allow_pickle=True)\n",
    "eval": "eval('1 + 1')\n",
    "exec": "exec('x = 1')\n",
    "builtins.eval": "import builtins\nbuiltins.eval('1')\n",
    "eval nested in a function": "def f(s):\n    return [eval(s)]\n",
}

SAFE = {
    "module.eval()": "import torch\nmodel = torch.nn.Linear(1, 1)\nmodel.eval()\n",
    "torch.load weights_only=True": "import torch\ntorch.load('w.pt', map_location='cpu', weights_only=True)\n",
    "np.load default": "import numpy as np\nnp.load('a.npy')\n",
    "np.load allow_pickle=False": "import numpy as np\nnp.load('a.npy', allow_pickle=False)\n",
    "safetensors": "from safetensors.numpy import load_file\nload_file('w.safetensors')\n",
    "ast.literal_eval": "import ast\nast.literal_eval('[1]')\n",
    "json.load": "import json\njson.load(open('x'))\n",
    "the word pickle in a string": "msg = 'never unpickle'\n",
}


@pytest.mark.parametrize("label", list(BAD))
def test_scanner_flags_planted_snippet(label):
    findings = scan_source(textwrap.dedent(BAD[label]))
    assert findings, f"missed: {label}"


@pytest.mark.parametrize("label", list(SAFE))
def test_scanner_lets_safe_code_pass(label):
    assert scan_source(SAFE[label]) == []


def test_scanner_catches_a_planted_file_in_the_tree(tmp_path):
    """The same walk as the package scan, on a copy of one real file with a bad line appended."""
    real = ROOT / "edgebnn" / "importers" / "checkpoint.py"
    planted = tmp_path / "checkpoint.py"
    planted.write_text(real.read_text(encoding="utf-8") + "\n\ndef sneaky(p):\n    return torch.load(p)\n")
    assert scan_source(real.read_text(encoding="utf-8")) == []
    findings = scan_source(planted.read_text(encoding="utf-8"), str(planted))
    assert [f.what for f in findings] == ["calls torch.load() without weights_only=True"]
