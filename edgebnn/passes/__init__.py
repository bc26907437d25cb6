"""Lowering passes: each takes an IR and returns ``PassResult(ir, modified, report)``."""
