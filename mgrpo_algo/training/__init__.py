"""Training: the one iteration loop (``trainer``), its in-process and role-server backends
(``decoupled``, ``roles``) and the checks run before a run starts (``preflight``).

Layer 3: imports the layers below."""
