"""The reference start's held-out evaluation (``eval.reference``: the oracle clone in configs/demo.yaml) exactly as
``mgrpo compare`` runs it, alone: for sweeps that ran compare with ``eval.reference=''`` to save its time.

    python benchmarks/reference_eval.py OUT_DIR [CONFIG]    (writes OUT_DIR/eval_reference.jsonl)
"""
import copy
import json
import sys
from pathlib import Path

import mgrpo_scenarios
from mgrpo_algo.core.config import load_config
from mgrpo_algo.core.seeding import torch_threads
from mgrpo_algo.experiments.compare import _full_evaluation, evaluation_policies
from mgrpo_env.episode import write_jsonl

config = load_config(sys.argv[2] if len(sys.argv) > 2 else "configs/demo.yaml", [])
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
with torch_threads(config.torch_threads):
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    ref_paths = {role: str(Path(config.eval.reference) / role) for role in ("main", "sub")}
    ref_config = copy.deepcopy(config)
    ref_config.eval.greedy = False
    figures, records, seconds = _full_evaluation(ref_config, scenario, lambda c: evaluation_policies(c, ref_paths, ref_paths, config.seed),
                                                 seed=config.seed, progress=False, name="reference")
write_jsonl(out / "eval_reference.jsonl", records)
print(json.dumps({k: v for k, v in figures.items() if k in ("em", "mean_k", "pass_k")}), seconds)
