"""Where roles run and how they share statistics: placements (local, processes, Ray) and stores
(SQLite, Redis). Backends are named in registries and imported on first use, so no module imports
the one that imports it.

Layer 1: imports only ``core``."""
