"""The mgrpo command line: eval with each kind of agent, train's config errors, exit codes."""

from __future__ import annotations

import json
import re

import pytest

from mgrpo_algo.cli import main
from mgrpo_algo.policies.models import build_role_models


def world_args(scenario) -> list[str]:
    return ["--set", "num_entities=300", "--set", f"data_dir={scenario.data_dir}"]


def test_eval_oracle_writes_summary_outcomes_and_episodes(small_scenario, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["eval", *world_args(small_scenario), "--split", "stage2/test", "--limit", "6", "--quiet", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_tasks"] == 6 and summary["exact_match"] == 1.0
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6
    assert "agent: oracle" in capsys.readouterr().out


def test_eval_model_checkpoints_with_run_averaging(small_scenario, tmp_path, capsys):
    sizes = {r: {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1} for r in ("main", "sub")}
    folder = tmp_path / "agent"
    build_role_models(small_scenario, folder, sizes, vocab_size=512, roles=["main", "sub"])
    code = main(["eval", *world_args(small_scenario), "--agent", str(folder), "--split", "stage1/test", "--limit", "2",
                 "--runs", "2", "--max-new-tokens", "8", "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "2 runs: exact match" in printed and "lookup" in printed


def test_eval_refuses_unknown_agents_and_splits(small_scenario, tmp_path, capsys):
    assert main(["eval", *world_args(small_scenario), "--agent", "gpt-99"]) == 2
    assert "unknown --agent" in capsys.readouterr().err
    assert main(["eval", *world_args(small_scenario), "--split", "stage3/test"]) == 2
    assert "unknown split" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["eval", *world_args(small_scenario), "--agent", str(tmp_path / "empty"), "--limit", "1"]) == 2
    assert "no model for main, sub" in capsys.readouterr().err


def test_unknown_scenario_lists_the_valid_ones(capsys):
    assert main(["eval", "--scenario", "nope"]) == 2
    assert re.search("available: .*wiki-hops", capsys.readouterr().err)


def test_train_bad_config_exits_2_naming_the_field(tmp_path, capsys):
    assert main(["train", "--set", "group_size=1"]) == 2
    assert "group_size" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: mgrpo\nmain: {learnr: {lr: 1}}\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "main.learnr" in capsys.readouterr().err
    # a cross-field check (every mode runs on every placement; a served engine needs the local placement)
    assert main(["train", "--set", "main.served={base_url: 'http://127.0.0.1:9'}", "--placement", "processes",
                 "--set", f"out_dir={tmp_path}/x", "--set", "warm_start.epochs=0"]) == 2
    assert "placement.kind" in capsys.readouterr().err


def _serve(scenario, *extra: str):
    """Run ``mgrpo serve`` in a child process; (process, the JSON line it prints).

    stderr goes to a file, not a pipe: a child blocked on a full pipe would look like a hang.
    """
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed with the process in _stop)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mgrpo_algo.cli", "serve", *world_args(scenario), *extra],
        cwd=root, stdout=subprocess.PIPE, stderr=err, text=True,
        # Started with SIGINT ignored, as under nohup or a parent that ignores it (an earlier test of
        # the suite did): serve must still stop on Ctrl-C and close its world.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    proc.err_file = err
    line = ""
    for line in proc.stdout:  # "world at ..." first, then the JSON line
        if line.startswith("{"):
            break
    if line.startswith("{"):
        return proc, json.loads(line)
    proc.wait()
    err.seek(0)
    return proc, {"error": err.read()}


def _stop(proc) -> None:
    import signal
    import subprocess

    proc.send_signal(signal.SIGINT)  # the command's own Ctrl-C path: it closes the world
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.err_file.seek(0)
        raise AssertionError(f"mgrpo serve did not stop on SIGINT; its stderr:\n{proc.err_file.read()[-4000:]}") from None
    finally:
        proc.stdout.close()
        proc.err_file.close()


def _listening(pid: int) -> set[tuple[str, int]]:
    import psutil

    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"}


def test_serve_binds_loopback_unless_told(small_scenario):
    proc, shown = _serve(small_scenario)
    try:
        assert shown.get("url") == "http://wiki-hops.test", shown
        port = int(shown["served_url"].rsplit(":", 1)[1])
        assert shown["served_url"] == f"http://127.0.0.1:{port}"
        assert _listening(proc.pid) == {("127.0.0.1", port)}  # loopback only, not 0.0.0.0 or ::
    finally:
        _stop(proc)
    # --host is passed to the site ("localhost" is still loopback: tests bind nothing else).
    proc, shown = _serve(small_scenario, "--host", "localhost")
    try:
        port = int(shown["served_url"].rsplit(":", 1)[1])
        assert shown["served_url"] == f"http://localhost:{port}", shown
        assert ("127.0.0.1", port) in _listening(proc.pid)
    finally:
        _stop(proc)


def test_serve_takes_ctrl_c_as_soon_as_it_says_it_is_ready(small_scenario, monkeypatch):
    """The JSON line promises that Ctrl-C now stops serve: a SIGINT sent the moment it is read must end
    the command, even when the process started with SIGINT ignored. (The handler used to be installed
    after the line; under load the test's SIGINT came first, was ignored, and serve slept on.)"""
    import signal
    import types

    import mgrpo_algo.cli as cli

    slept: list[float] = []

    def spy_print(*args, **kwargs):
        print(*args, **kwargs)
        if args and str(args[0]).startswith("{"):
            signal.raise_signal(signal.SIGINT)  # the caller's Ctrl-C, right after it read the ready line

    def no_sleep(seconds):  # reached only if that Ctrl-C was lost: stop instead of hanging the suite
        slept.append(seconds)
        raise KeyboardInterrupt

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(cli, "print", spy_print, raising=False)
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(sleep=no_sleep))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup
    try:
        assert main(["serve", *world_args(small_scenario)]) == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert slept == []


def test_a_script_that_hands_its_arguments_to_main_is_named_in_the_reproduce_lines(tmp_path, monkeypatch, capsys):
    """A script that registers a mode and then runs ``main(argv, prog=...)`` (benchmarks/shared_model.py)
    records itself, not the installed ``mgrpo``, which would not know the mode."""
    from mgrpo_algo.experiments import compare
    from mgrpo_algo.training import preflight

    class Ran(Exception):
        pass

    seen = {}

    def fake_run_compare(config, **kwargs):
        seen.update(kwargs)
        raise Ran

    monkeypatch.setattr(compare, "run_compare", fake_run_compare)
    monkeypatch.setattr(preflight, "preflight", lambda config, **kw: [])
    with pytest.raises(Ran):
        main(["compare", "--seeds", "1", "--modes", "mgrpo", "--out", str(tmp_path / "o")], prog="python 'my script.py'")
    assert seen["program"] == "python 'my script.py'"  # a shell fragment, quoted as the script was started
    assert seen["command"] == f"python 'my script.py' compare --seeds 1 --out {tmp_path / 'o'} --modes mgrpo"
    assert compare._reproduce(tmp_path, 2, ["mgrpo", "x"], "python s.py") == (
        f"python s.py compare --config {tmp_path / 'config.yaml'} --seeds 2 --out {tmp_path} --modes mgrpo,x")
    with pytest.raises(Ran):
        main(["compare", "--seeds", "1", "--modes", "mgrpo", "--out", str(tmp_path / "o")])
    assert seen["program"] == "mgrpo" and seen["command"].startswith("mgrpo compare --seeds 1")
