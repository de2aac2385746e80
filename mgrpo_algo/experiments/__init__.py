"""Experiments on top of training: evaluation, ``mgrpo compare``, plots and ``mgrpo view``.

Layer 4: imports the layers below; only ``mgrpo_algo.cli`` is above it."""
