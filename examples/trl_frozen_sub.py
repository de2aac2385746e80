"""TRL's GRPOTrainer trains the planner on the mgrpo env over OpenEnv; the sub-agents stay frozen.

TRL's own version of the frozen-sub baseline (``mgrpo train --set mode=frozen-sub``): the demo's start
planner (``configs/demo-warm-start/main``) is TRL's model; the env is ``mgrpo serve-env`` (started here
unless ``--env-url`` names one), reached through TRL's ``environment_factory`` with the planner's
tools ``delegate`` / ``reason``; each delegation is played inside the environment class by the frozen
start sub-agent (``configs/demo-warm-start/sub``). The rewards are the env's main reward with the
config's weights. Run from the repository root::

    python examples/trl_frozen_sub.py                       # the demo's budget: 128 steps x 16 rollouts
    python examples/trl_frozen_sub.py --steps 2 --out runs/trl_try
    mgrpo eval --config configs/demo.yaml --agent main=runs/trl_frozen_sub/main,sub=configs/demo-warm-start/sub

Needs the ``trl`` and ``openenv`` extras (``make install`` installs both). docs/guides/trl.md explains
the pieces (mgrpo_algo.experiments.trl_env).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from mgrpo_env import strict_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo.yaml", help="the run's TrainConfig (start models, rewards, K, ...)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    ap.add_argument("--split", default="stage2/train", help="the training questions (the demo's RL stage)")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps of questions_per_iteration x group_size rollouts (default: the config's iterations)")
    ap.add_argument("--env-url", default=None, help="a running `mgrpo serve-env --config CONFIG --split SPLIT`")
    ap.add_argument("--out", default="runs/trl_frozen_sub", help="output folder: main/ (the trained planner), log.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL 1.16

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.experiments.serve_env_cli import ServeEnvProcess
    from mgrpo_algo.experiments.trl_env import FrozenSubEnv, frozen_sub_trainer, split_task_ids

    config = load_config(args.config, args.set)
    steps = args.steps or sum(stage.iterations for stage in config.stages)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = None
    if args.env_url is None:
        server = ServeEnvProcess("--config", args.config, "--split", args.split, "--port", "0").start()
    url = args.env_url or server.url
    started = time.perf_counter()
    try:
        trainer = frozen_sub_trainer(url, config, split_task_ids(config, args.split),
                                     output_dir=str(out / "trainer"), max_steps=steps)
        trainer.train()
    finally:
        if server is not None:
            server.stop()
    minutes = (time.perf_counter() - started) / 60

    # the trained planner, with the start's tokenizer files (its plain ChatML, its stop ids)
    trainer.model.save_pretrained(out / "main")
    start = Path(config.main.model)
    for name in TOKENIZER_FILES:
        if (start / name).is_file():
            shutil.copy(start / name, out / "main" / name)
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    batch = config.questions_per_iteration * config.group_size
    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": args.config, "set": args.set,
               "split": args.split, "steps": steps, "rollouts": steps * batch, "minutes": round(minutes, 1),
               "reward_first_10": sum(rewards[:10]) / max(1, len(rewards[:10])),
               "reward_last_10": sum(rewards[-10:]) / max(1, len(rewards[-10:])),
               "episodes_cut_by_trl": FrozenSubEnv.cut, "episode_ends": dict(FrozenSubEnv.ends),
               "log": trainer.state.log_history}
    (out / "log.json").write_text(strict_json.dumps(summary, indent=1))
    print(f"{steps} steps x {batch} rollouts in {minutes:.1f} min; mean main reward: first 10 steps "
          f"{summary['reward_first_10']:.3f}, last 10 {summary['reward_last_10']:.3f}; "
          f"episodes cut by TRL: {FrozenSubEnv.cut}")
    print(f"planner: {out / 'main'}  evaluate: mgrpo eval --config {args.config} "
          f"--agent main={out / 'main'},sub={config.sub.model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
