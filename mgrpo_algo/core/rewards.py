"""The reward formulas, re-exported from :mod:`mgrpo_env.rewards` (one source of truth)."""

from mgrpo_env.rewards import *  # noqa: F403
from mgrpo_env.rewards import __all__  # noqa: F401
