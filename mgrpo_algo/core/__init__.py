"""The method itself, free of models and I/O: advantages, losses, batch scoring, token sequences,
seeds, the typed configuration and its tables (modes). The reward formulas are the env's
(``mgrpo_env.rewards``), imported from there.

Layer 0 of ``mgrpo_algo``: imports nothing else from the package (``tests/test_layers.py``)."""
