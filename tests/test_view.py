"""``mgrpo view``: the HTML page of a run's episodes, checked in headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgrpo_algo.cli import main
from mgrpo_env import write_jsonl
from mgrpo_env.rollout import collect
from mgrpo_env.scripted import OraclePolicy, RandomPolicy

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INJECTED = "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">"


@pytest.fixture(scope="module")
def run_dir(small_scenario, small_world, tmp_path_factory):
    """A run folder with 3 oracle (correct) and 3 random (incorrect) episodes; one carries a script."""
    tasks = list(small_scenario.tasks("stage2/test"))[:3]
    oracle = {"main": OraclePolicy(small_scenario, "main"), "sub": OraclePolicy(small_scenario, "sub")}
    random = {"main": RandomPolicy("main", seed=1), "sub": RandomPolicy("sub", seed=2)}
    records = collect(small_scenario, tasks, 1, oracle, world=small_world)
    records += collect(small_scenario, tasks, 1, random, world=small_world, seed=7)
    assert any(r.correct for r in records) and not all(r.correct for r in records)
    records[0].main.turns[0].action = INJECTED + records[0].main.turns[0].action
    records[0].main.turns[0].observation += "\n" + "long observation line\n" * 80  # folds behind a button
    folder = tmp_path_factory.mktemp("run")
    write_jsonl(folder / "episodes.jsonl", records)
    return folder, records


@pytest.fixture(scope="module")
def page(run_dir):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium at /usr/bin/chromium")
    folder, _ = run_dir
    assert main(["view", str(folder)]) == 0
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page()
        tab.goto((folder / "view.html").resolve().as_uri())
        yield tab
        browser.close()


def test_page_counts_and_episode_tree(page, run_dir):
    _, records = run_dir
    n_correct = sum(r.correct for r in records)
    assert page.inner_text("#total") == str(len(records))
    assert page.inner_text("#shown") == str(len(records))
    assert page.inner_text("#n-correct") == str(n_correct)
    assert page.inner_text("#n-incorrect") == str(len(records) - n_correct)
    episodes = page.locator("details.ep")
    assert episodes.count() == len(records)
    first = episodes.nth(0)
    assert not first.locator("table.kv").first.is_visible()  # collapsed by default
    first.locator("summary").first.click()
    record = records[0]
    assert first.locator("pre.question").first.is_visible()
    assert record.task["question"] in first.locator("pre.question").first.inner_text()
    task = first.locator("details.sub pre.task").first
    assert task.is_visible() and task.inner_text() == record.subs[0].task
    tool = first.locator("details.sub .toolname").first
    assert tool.is_visible() and tool.inner_text() == record.subs[0].tool_calls[0].tool
    # a long observation starts folded; its button unfolds it
    clip = first.locator("div.clip").first
    assert "folded" in clip.locator("pre").get_attribute("class")
    clip.locator("button.more").click()
    assert "folded" not in clip.locator("pre").get_attribute("class")


def test_filter_and_search(page, run_dir):
    _, records = run_dir
    episodes = page.locator("details.ep")
    page.select_option("#filter", "incorrect")
    visible = [i for i in range(episodes.count()) if episodes.nth(i).is_visible()]
    assert visible == [i for i, r in enumerate(records) if not r.correct]
    assert page.inner_text("#shown") == str(len(visible))
    page.select_option("#filter", "all")
    page.fill("#search", records[1].task["question"][-25:].upper())
    visible = [i for i in range(episodes.count()) if episodes.nth(i).is_visible()]
    assert len(visible) < len(records) and 1 in visible
    page.fill("#search", "")
    assert page.inner_text("#shown") == str(len(records))


def test_agent_text_is_escaped_not_run(page):
    assert page.evaluate("window.pwned") is None
    first = page.locator("details.ep").nth(0)
    if first.get_attribute("open") is None:
        first.locator("summary").first.click()
    assert "<script>window.pwned = 1</script>" in first.locator("pre.action").first.inner_text()
    assert page.locator("main script").count() == 0 and page.locator("main img").count() == 0


def test_cap_note_and_out_option(run_dir, tmp_path, capsys):
    folder, records = run_dir
    out = tmp_path / "page.html"
    assert main(["view", str(folder), "--out", str(out), "--max-episodes", "2"]) == 0
    text = out.read_text()
    assert text.count('<details class="ep"') == 2
    assert f"first 2 of {len(records)} episodes" in text
    assert "<script>window.pwned" not in text
    assert str(out) in capsys.readouterr().out


def test_missing_file_and_malformed_line(tmp_path, run_dir, capsys):
    assert main(["view", str(tmp_path / "nowhere")]) == 2
    assert "no episodes file" in capsys.readouterr().err
    folder, _ = run_dir
    bad = tmp_path / "bad"
    bad.mkdir()
    lines = (folder / "episodes.jsonl").read_text().splitlines()
    (bad / "episodes.jsonl").write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    assert main(["view", str(bad)]) == 2
    assert f"{bad / 'episodes.jsonl'}:2:" in capsys.readouterr().err
    (bad / "episodes.jsonl").write_text(json.dumps({"episode_id": "x", "task": {}, "nonsense": 1}) + "\n")
    assert main(["view", str(bad)]) == 2
    assert "episodes.jsonl:1:" in capsys.readouterr().err
    assert not (bad / "view.html").exists()


def test_a_training_runs_sub_advantages_are_joined_by_the_records_key(tmp_path):
    """The sub side keeps A_S in ``workers/<role>/advantages/<t>.json``; the page joins them to the record
    of the same iteration and index (a duplicated sub-agent counts its slots), not to another iteration's
    record at the same index; a record without a key and a malformed file are told apart."""
    from mgrpo_algo.experiments.view import join_sub_advantages
    from mgrpo_env.episode import AgentTrajectory, EpisodeRecord

    def record(iteration, index):
        return EpisodeRecord(f"e{iteration}-{index}", {"id": "t"}, subs=[AgentTrajectory("sub_0", "sub")],
                             trajectory_key={"iteration": iteration, "index": index})

    records = [record(3, 0), record(3, 1), record(4, 0), EpisodeRecord("eval", {"id": "t"})]
    folder = tmp_path / "workers" / "sub" / "advantages"
    folder.mkdir(parents=True)
    (folder / "3.json").write_text(json.dumps([{"index": 0, "agent": "sub_0", "slot": 0, "reward": 1.0, "advantage": 0.5},
                                               {"index": 0, "agent": "sub_0", "slot": 1, "reward": 1.0, "advantage": 0.5},
                                               {"index": 1, "agent": "sub_0", "slot": 0, "reward": 0.0, "advantage": -1.0},
                                               {"index": 7, "agent": "sub_0", "slot": 0, "reward": 0.0, "advantage": 9.0}]))
    assert join_sub_advantages(records, tmp_path) == 3  # index 7 is not among the records shown
    assert records[0].components["sub_0"] == {"advantage": 0.5, "aligned_slots": 2}
    assert records[1].components["sub_0"] == {"advantage": -1.0, "aligned_slots": 1}
    assert records[2].components == {} and records[3].components == {}  # iteration 4 has no file yet; no key
    (folder / "4.json").write_text(json.dumps([{"index": 0}]))
    with pytest.raises(ValueError, match=r"4\.json: not a sub side's advantages"):
        join_sub_advantages(records, tmp_path)
