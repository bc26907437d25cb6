"""The study file: Optuna's journal storage in one append-only file, and what makes a search resumable.

:class:`~optuna.storages.journal.JournalFileBackend` appends one JSON line per operation under a file lock, so
a search killed at any point leaves a file whose complete lines replay to the state before the kill (a torn
last line is ignored by the reader). The study records the settings that decide the trials (model digest,
data, space, objectives, seed, population, device); re-running the same command continues the study, and a
different command on the same file is refused rather than mixed into it.

Reproducible proposals: each trial is asked from an NSGA-II sampler seeded with ``(seed, trial number)``
(:func:`trial_sampler`), so a trial's config depends only on the seed, its number and the trials completed
before its batch, never on how many processes ran or where the search was interrupted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebnn.errors import InvalidArtifactError, InvalidOptionError, MissingDependencyError

if TYPE_CHECKING:
    import optuna

STUDY_NAME = "edgebnn-search"
SETTINGS_KEY = "edgebnn_settings"
BASELINE_KEY = "edgebnn_baseline"
CONFIG_KEY = "edgebnn_config"
RESULT_KEY = "edgebnn_result"
DEFAULT_POPULATION = 6
"""NSGA-II population (and parallel batch). With 24 trials, 4 generations of 6 found a >= 16x digits artifact within
nll=+0.05,ece=+0.01 for 8 of 8 seeds, 3 generations of 8 (or 2 of 12) for 4 of 8 (docs/search.md)."""


def import_optuna() -> Any:
    """optuna, quiet, or a one-line error naming the extra to install."""
    try:
        import optuna
    except ImportError as e:
        raise MissingDependencyError("edgebnn search needs optuna: pip install 'edgebnn[search]'") from e
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:150]}" if text else type(e).__name__


def file_digest(path: str | Path) -> str:
    """sha256 of a file (the model a study was made for)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def trial_sampler(seed: int, number: int, population: int) -> optuna.samplers.BaseSampler:
    """The NSGA-II sampler trial ``number`` is asked from: seeded by ``(seed, number)``."""
    import numpy as np

    optuna = import_optuna()
    child_seed = int(np.random.SeedSequence([seed, number]).generate_state(1)[0])
    return optuna.samplers.NSGAIISampler(population_size=population, seed=child_seed)


def open_study(path: str | Path, settings: dict[str, Any], directions: list[str]) -> optuna.Study:
    """Create the study in ``path``, or load it when the file holds one made with the same ``settings``.

    Raises:
        InvalidOptionError: The file holds a study made by another command (names the settings that differ).
        InvalidArtifactError: The file is not an Optuna journal.
    """
    optuna = import_optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = Path(path)
    if not path.parent.is_dir():
        raise InvalidOptionError(f"--study {path}: directory {path.parent} does not exist")
    existing = path.is_file() and path.stat().st_size > 0
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        if any(s.study_name == STUDY_NAME for s in storage.get_all_studies()):
            study = optuna.load_study(study_name=STUDY_NAME, storage=storage)  # appends nothing
        elif existing:  # never append to a file that is not ours (or is torn or corrupt)
            raise InvalidArtifactError(f"--study {path}: not an edgebnn search study file (it holds no study "
                                       f"{STUDY_NAME!r})")
        else:
            study = optuna.create_study(study_name=STUDY_NAME, storage=storage, directions=directions)
        stored = study.user_attrs.get(SETTINGS_KEY)
        if stored is None and not study.trials:
            study.set_user_attr(SETTINGS_KEY, settings)  # a new study (this replays the file once more)
            stored = settings
    # What Optuna's journal replay raises on a corrupt file: bad JSON or UTF-8, logs of the wrong shape, its own
    # "Should not reach" assertion.
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError) as e:
        raise InvalidArtifactError(f"--study {path}: not an edgebnn search study file ({_reason(e)})") from e
    if stored is None:
        raise InvalidArtifactError(f"--study {path}: holds trials of a study edgebnn did not make")
    if not isinstance(stored, dict):
        raise InvalidArtifactError(f"--study {path}: not an edgebnn search study file (its settings are not an object)")
    if stored != settings:
        differ = sorted(k for k in settings.keys() | stored.keys() if settings.get(k) != stored.get(k))
        raise InvalidOptionError(f"--study {path}: was made by another search (differs in {', '.join(differ)}); "
                                 "give a new --study file to start over")
    return study
