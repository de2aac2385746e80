"""The method itself, free of models and I/O: advantages, losses, batch scoring, token sequences,
seeds, the reward formulas (re-exported from the env) and the typed configuration.

Layer 0 of ``mgrpo_algo``: imports nothing else from the package (``tests/test_layers.py``)."""
