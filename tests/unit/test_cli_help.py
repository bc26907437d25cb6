"""Every option of every command says what it does in ``--help`` (issue 45: ``export --target`` had no help)."""

from __future__ import annotations

import click

from edgebnn.cli import main


def test_every_option_of_every_command_has_help() -> None:
    ctx = click.Context(main)
    missing = [f"{name} {opt.opts[0]}" for name in main.list_commands(ctx)
               for opt in main.get_command(ctx, name).params
               if isinstance(opt, click.Option) and not (opt.help or "").strip()]
    assert missing == []
