"""``mgrpo status`` reads a run's progress back: the loop's commit, each worker's ``worker.json`` and
the health records and done marks each role wrote to the run's store (their one reader)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mgrpo_algo.cli import main as cli_main
from mgrpo_algo.distributed.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def _run(small_scenario, out: Path, iterations: int) -> None:
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    start = ROOT / "configs" / "oracle-warm-start"
    config = load_config(None, [
        f"main.model={start / 'main'}", f"sub.model={start / 'sub'}", "align_d=1", "questions_per_iteration=1",
        "group_size=2", f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}, profile: tiny}}",
        "limits={max_main_turns: 3, max_sub_turns: 2, max_delegations: 1}",
        f"stages=[{{split: stage2/train, iterations: {iterations}}}]", f"out_dir={out}", f"models_dir={out.parent / 'models'}"])
    with Trainer(config) as trainer:
        trainer.run()


def test_status_of_a_run_from_its_files_and_its_store(small_scenario, tmp_path, capsys):
    run = tmp_path / "run"
    _run(small_scenario, run, 2)
    assert cli_main(["status", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["committed"] == 1 and status["store"] == f"sqlite:{run / 'stats.sqlite'}" and status["store_error"] is None
    for role in ("main", "sub"):
        r = status["roles"][role]
        assert (r["last_applied"], r["pending"], r["store_done"], r["store_done_count"]) == (1, [], 1, 2), role
        assert r["health"]["step"] == 1 and r["health"]["role"] == role
        assert f"{role}/step" in r["health"]["metrics"]  # the learner's figures, not the scoring ones
        assert not any(k.startswith("align/") for k in r["health"]["metrics"])
    assert cli_main(["status", str(run)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"run {run}: loop committed iteration 1"
    assert [line.split()[:4] for line in table[3:]] == [["main", "1", "-", "1"], ["sub", "1", "-", "1"]]

    # a worker that has queued an iteration and a store that lags behind the files: each shown as it is
    state = json.loads((run / "workers" / "sub" / "worker.json").read_text())
    state["pending"] = {"2": {"facts": [], "scoring": {}}}
    (run / "workers" / "sub" / "worker.json").write_text(json.dumps(state))
    store = open_store(f"sqlite:{run / 'stats.sqlite'}")
    store.mark_done("main", 2)
    store.close()
    assert cli_main(["status", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["roles"]["sub"]["pending"] == [2] and status["roles"]["main"]["store_done"] == 2


def test_status_of_no_run_and_of_an_unreadable_store(small_scenario, tmp_path, capsys):
    assert cli_main(["status", str(tmp_path / "nowhere")]) == 2
    assert "is no run folder" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "workers" / "main").mkdir(parents=True)
    (run / "workers" / "main" / "worker.json").write_text(json.dumps({"last_applied": 4, "metrics": {}}))
    (run / "stats.sqlite").write_bytes(b"this is not an SQLite file" * 100)
    assert cli_main(["status", str(run), "--json"]) == 0  # the files' figures still stand
    status = json.loads(capsys.readouterr().out)
    assert status["committed"] is None and status["roles"]["main"]["last_applied"] == 4
    assert status["store_error"] and "health" not in status["roles"]["main"]
    shutil.rmtree(run)
