"""Training: the one iteration loop (``trainer``), the role worker behind every placement (``roles``)
and its handles (``workers``), and the checks run before a run starts (``preflight``).

Layer 3: imports the layers below."""
