"""A new placement, registered from outside the package: role workers in this process, every call timed.

A placement is a ``RoleHandle`` subclass (``mgrpo_algo.distributed.placement``): ``_start`` builds the
role worker from its factory and keyword arguments, ``_call`` runs one of its methods, ``_alive`` /
``_kill`` / ``_close`` manage its life; the base class gives every placement the same semantics
(one call at a time per handle, ``submit`` on the handle's own thread, typed errors for a dead
server). Registering the class under a name in ``PLACEMENTS`` makes that name a valid
``placement.kind`` (checked when the config loads); the iteration loop, the workers, the scoring and
the commit protocol do not change.

This one extends the local handle: each call to a worker (``act``, ``update``, ``commit``, ...)
is timed, which shows where an iteration's time goes per role. This file is the whole change. It
trains one short iteration of the oracle clone's tiny models with ``placement.kind=timed``
and prints the table.

    python examples/extend/new_placement.py [OUT_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from mgrpo_algo.core.config import load_config
from mgrpo_algo.distributed.placement import PLACEMENTS
from mgrpo_algo.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
#: The oracle clone's tiny models (``configs/oracle-warm-start``) on the world they were trained for
#: (the wiki-hops tiny profile): their rewards vary within a group. One short iteration.
SETTING = [*(f"{role}.model={ROOT / 'configs' / 'oracle-warm-start' / role}" for role in ("main", "sub")),
           "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
           "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}",
           "questions_per_iteration=2", "group_size=4", "stages=[{split: stage2/train, iterations: 1}]"]

#: (role server name, method) -> [calls, seconds], filled by every TimedLocal handle.
TIMES: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])


class TimedLocal(PLACEMENTS.get("local")):
    """The local handle (the worker in this process, arguments by reference), every call timed."""

    placement = "timed"

    def _call(self, method: str, args: tuple, kwargs: dict, timeout_s: float | None) -> Any:
        start = time.perf_counter()
        try:
            return super()._call(method, args, kwargs, timeout_s)
        finally:
            entry = TIMES[(self.name, method)]
            entry[0] += 1
            entry[1] += time.perf_counter() - start


PLACEMENTS.register("timed", TimedLocal)


def main(out: Path) -> None:
    config = load_config(None, [
        *SETTING,
        "placement.kind=timed",  # the new name, checked when the config loads
        f"out_dir={out / 'run'}", f"models_dir={out / 'models'}",
    ])
    with Trainer(config) as trainer:
        history = trainer.run()
        kinds = {role: handle.placement for role, handle in trainer.handles.items()}
    print(f"trained {len(history)} iteration(s); role handles: {kinds}")
    print(f"{'role server':<14} {'method':<14} {'calls':>6} {'seconds':>8}")
    for (name, method), (calls, seconds) in sorted(TIMES.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<14} {method:<14} {calls:>6.0f} {seconds:>8.3f}")
    assert set(kinds.values()) == {"timed"} and TIMES[("mgrpo-main", "act")][0] > 0


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mgrpo-timed-")))
