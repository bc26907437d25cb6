"""What ``lower --budget ... --minimize latency`` prints: the chosen export, its latency ratios, its command."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape


def print_fastest(console: Console, fastest: dict[str, Any], path: str) -> None:
    """The chosen layers, mode and S, the latency against one float pass and the float BNN's export, the command."""
    base, ref = fastest["baselines_ms"], fastest["float_bnn_export"]
    ratios = fastest["ratios"]
    command = shlex.split(fastest["export_command"])
    command[2], command[4] = path, str(Path(path).with_suffix(".onnx"))
    lines = [
        f"fastest export within the budget on {fastest['device']} (onnxruntime, {fastest['threads']} threads, batch "
        f"{fastest['batch']}, {fastest['of']}, {len(fastest['candidates'])} candidates timed):",
        f"  runs once (deterministic): {', '.join(fastest['deterministic']) or 'none'}; sampled: "
        f"{', '.join(fastest['sampled'])}; mode {fastest['mode']}, S={fastest['samples']}",
        f"  latency {fastest['latency_ms']:.3f} ms: {ratios['vs_float_pass']:.2f}x one float pass "
        f"({base['float_pass']:.3f} ms), {ratios['vs_float_bnn_export']:.2f}x the float BNN's export "
        f"({ref['mode']}, S={ref['samples']}: {base['float_bnn_export']:.3f} ms)",
        f"  write it: {shlex.join(command)}",
    ]
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)
