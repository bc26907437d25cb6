"""A ``--model`` module that raises while being imported (``hostile_broken_module:anything``)."""

raise RuntimeError("this module is broken on purpose")
