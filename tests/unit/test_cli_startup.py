"""``edgebnn --help``, ``--version`` and every ``COMMAND --help`` import none of the heavy libraries (torch, onnx,
onnxruntime: seconds of imports; nor scipy or numpy) and no plug-in: those load when a command runs. Checked on
the modules a fresh process holds, not on a timing (bench/cli_startup.py times them:
docs/results/2026-12-07-cli-startup.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from edgebnn.cli import main

HEAVY = ("torch", "onnx", "onnxruntime", "scipy", "ml_dtypes", "numpy")

PROBE = textwrap.dedent("""
    import json, sys
    from edgebnn.cli import main

    heavy = {heavy!r}
    calls = [["--version"], ["--help"], *([name, "--help"] for name in sorted(main.commands)),
             ["--plugin", "eb_startup_probe", "lower", "--help"]]
    found = []
    for argv in calls:
        try:
            main.main(argv, prog_name="edgebnn", standalone_mode=True)
        except SystemExit as e:
            assert e.code in (0, None), (argv, e.code)
        now = sorted(m for m in (*heavy, "eb_startup_probe", "edgebnn.families") if m in sys.modules)
        found.append([" ".join(argv), now])
    print(json.dumps(found))
""")


def test_help_and_version_import_no_heavy_library_and_no_plugin(tmp_path):
    # a plug-in that imports torch, named both ways a user names one: help must import neither it nor torch
    (tmp_path / "eb_startup_probe.py").write_text("import torch  # noqa: F401\n")
    env = {"EDGEBNN_PLUGINS": "eb_startup_probe", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": ":".join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout.splitlines()[-1])
    assert len(found) >= 12  # --version, --help, ten commands and more, and --plugin ... --help
    first = next(((argv, mods) for argv, mods in found if mods), None)
    assert first is None, f"edgebnn {first[0]} imported {', '.join(first[1])}"


def test_a_command_that_runs_loads_the_plugins_it_names(tmp_path):
    """The other half: a command that runs (past its --help) loads --plugin first, so a missing one ends it."""
    r = CliRunner().invoke(main, ["--plugin", "eb_no_such_plugin", "inspect", str(tmp_path / "m.ebnn")])
    assert r.exit_code == 2
    assert "plug-in 'eb_no_such_plugin' (--plugin: eb_no_such_plugin) failed to import" in r.output
    r = CliRunner().invoke(main, ["--plugin", "eb_no_such_plugin", "inspect", "--help"])
    assert r.exit_code == 0 and "Show an .ebnn file's manifest" in r.output
