"""Loading a user's model factory and weights without ever unpickling a file.

Weights come from ``.safetensors`` (safetensors) or ``.pt``/``.pth`` (``torch.load(weights_only=True)``,
which refuses pickled code); either may hold the state dict itself or nest it under ``state_dict`` /
``model_state_dict``. Loading is strict: missing, unexpected or misshapen tensors are named.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

from edgebnn._io import cwd_on_path
from edgebnn.errors import InvalidOptionError, InvalidWeightsError, MissingDependencyError

_NESTED_KEYS = ("state_dict", "model_state_dict", "model")


def load_factory(spec: str) -> Any:
    """Build a model from ``package.module:factory`` (called with no arguments).

    A factory returning a list or tuple of modules (a deep ensemble's members) gives them as one
    ``nn.ModuleList``, whose state dict (member k's tensors prefixed ``k.``) is what ``--weights`` holds.
    The module is looked up with the working directory first on ``sys.path`` (as ``python -m`` does), so a
    ``mynet.py`` next to the user needs no ``PYTHONPATH``.
    """
    with cwd_on_path():
        return _load_factory(spec)


def _load_factory(spec: str) -> Any:
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise InvalidOptionError(f"--model {spec}: expected PACKAGE.MODULE:FACTORY")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise InvalidOptionError(f"--model {spec}: cannot import module {mod_name!r} ({e})") from e
    except (Exception, SystemExit) as e:  # the module itself raised (or called sys.exit) while importing
        raise InvalidOptionError(
            f"--model {spec}: importing module {mod_name!r} raised {type(e).__name__}: {_first_line(e)}"
        ) from e
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise InvalidOptionError(f"--model {spec}: module {mod_name!r} has no callable {attr!r}")
    try:
        model = factory()
    except (Exception, SystemExit) as e:  # SystemExit: a factory calling sys.exit() must not end edgebnn with 0
        raise InvalidOptionError(f"--model {spec}: the factory raised {type(e).__name__}: {_first_line(e)}") from e
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError("lowering a PyTorch model needs torch: pip install 'edgebnn[torch]'") from e
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, torch.nn.Module) for m in model):
        return torch.nn.ModuleList(model)  # a deep ensemble: one weights file, keys prefixed 0., 1., ...
    if not isinstance(model, torch.nn.Module):
        raise InvalidOptionError(f"--model {spec}: the factory returned {type(model).__name__}, not a torch.nn.Module "
                                 "(or a list of them: a deep ensemble)")
    return model


def read_state_dict(path: str | Path) -> dict[str, Any]:
    """Tensors of a checkpoint file, never executing pickled code."""
    import torch

    p = Path(path)
    if not p.is_file():
        raise InvalidWeightsError(f"{p}: no such file")
    if p.stat().st_size == 0:
        raise InvalidWeightsError(f"{p}: file is empty")
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(p)))
        except (SafetensorError, OSError, ValueError) as e:
            raise InvalidWeightsError(f"{p}: not a valid safetensors file ({_first_line(e)})") from e
    obj = read_torch_file(p)
    for key in _NESTED_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise InvalidWeightsError(f"{p}: expected a state_dict of tensors, got {type(obj).__name__}")
    return obj


def read_torch_file(path: str | Path) -> Any:
    """What ``torch.save`` wrote to ``path`` (tensors, and the containers, numbers and strings of the weights-only
    unpickler), loaded with ``torch.load(weights_only=True)``: never executing pickled code."""
    import torch

    p = Path(path)
    if not p.is_file():
        raise InvalidWeightsError(f"{p}: no such file")
    if p.stat().st_size == 0:
        raise InvalidWeightsError(f"{p}: file is empty")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below is the one line
            warnings.simplefilter("ignore")
            obj = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, BadZipFile, ...
        if "global" in str(e).lower():  # the weights_only unpickler met a class or function
            raise InvalidWeightsError(
                f"{p}: refused: the checkpoint holds pickled objects beyond tensors (weights_only load); "
                "save a state_dict or use .safetensors"
            ) from e
        if "weights only load failed" in str(e).lower():
            raise InvalidWeightsError(f"{p}: not a checkpoint of plain tensors (weights_only load refused it)") from e
        raise InvalidWeightsError(f"{p}: not a readable torch checkpoint ({_first_line(e)})") from e
    return obj


def load_weights(model: Any, path: str | Path) -> Any:
    """Load ``path`` into ``model`` strictly; errors name the file and the offending keys."""
    state = read_state_dict(path)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {_few(unexpected)}")
        raise InvalidWeightsError(f"{path}: does not match the model: {'; '.join(parts)}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise InvalidWeightsError(f"{path}: {k} has shape {tuple(v.shape)}, the model wants {tuple(own[k].shape)}")
    model.load_state_dict(state, strict=True)
    return model


def _few(keys: list[str], n: int = 4) -> str:
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
