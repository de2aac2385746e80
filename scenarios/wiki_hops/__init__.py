"""wiki-hops: the built-in offline deep-research world (a seeded fictional encyclopedia).

``WikiHops(seed=0, num_entities=2000, ...)`` follows :class:`mgrpo_scenarios.Scenario`; it is found
as ``mgrpo_scenarios.get("wiki-hops")`` through the ``mgrpo.scenarios`` entry point. See
:mod:`.scenario` for the arguments, :mod:`.world`, :mod:`.pages` and :mod:`.questions` for what is
generated, and :mod:`.oracle` for the scripted solver. Agents see the world at :data:`ORIGIN`
(``http://wiki-hops.test``), whatever loopback port serves it.
"""

from .oracle import OracleRun, solve
from .scenario import ORIGIN, VERSION, WikiHops, WikiWorld

__all__ = ["WikiHops", "WikiWorld", "OracleRun", "solve", "VERSION", "ORIGIN"]
