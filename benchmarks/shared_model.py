"""``mgrpo compare`` with the shared-model baseline registered (``examples/extend/new_mode_shared_model.py``).

A registered mode exists only in the process that registered it, so ``mgrpo compare --modes
mgrpo,shared-model`` cannot see it from the installed command. This script imports the example (which
registers ``shared-model`` with its fair start, ``configs/shared-warm-start``, and runs nothing when
imported), then hands its arguments to the command line unchanged:

    .venv/bin/python benchmarks/shared_model.py compare --config configs/demo.yaml --seeds 1 \\
        --modes mgrpo,shared-model --out runs/shared_model

The registration runs at import, so ``--jobs 2``'s spawned workers (which re-import this file) know it too.
The run's report names this script in its command lines (``prog``): the installed ``mgrpo`` cannot
reproduce a mode it does not know.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from mgrpo_algo.cli import main

ROOT = Path(__file__).resolve().parents[1]
runpy.run_path(str(ROOT / "examples" / "extend" / "new_mode_shared_model.py"))  # registers shared-model, runs nothing

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python benchmarks/shared_model.py"))
