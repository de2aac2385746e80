"""``python -m mgrpo_algo``: the ``mgrpo`` command line."""

import sys

from .cli import main

sys.exit(main())
