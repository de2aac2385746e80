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
def browser():
    """One headless Chromium for the module's pages (Playwright's sync API runs one instance at a time)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium at /usr/bin/chromium")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(run_dir, browser):
    folder, _ = run_dir
    assert main(["view", str(folder)]) == 0
    tab = browser.new_page()
    tab.goto((folder / "view.html").resolve().as_uri())
    yield tab
    tab.close()


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


@pytest.fixture(scope="module")
def attributed_run(small_scenario, small_world, tmp_path_factory):
    """A run folder as a training run leaves it (episodes.jsonl beside config.json, which names the scenario):
    the imperfect teacher's episodes (it answers early, reports without a visit: answers lost by the main
    agent and by the sub-agents) and the oracle's (right)."""
    from mgrpo_algo.core.config import config_to_dict, load_config
    from mgrpo_env.teacher import teacher_policies

    tasks = list(small_scenario.tasks("stage2/test"))[:10]
    teacher = teacher_policies(small_scenario, ["main", "sub"], {"answer_early": 0.5, "report_without_visit": 0.5,
                                                                 "visit_wrong_hit": 0.3}, seed=3)
    oracle = {"main": OraclePolicy(small_scenario, "main"), "sub": OraclePolicy(small_scenario, "sub")}
    records = collect(small_scenario, tasks, 2, teacher, world=small_world, seed=5)
    records += collect(small_scenario, tasks[:2], 1, oracle, world=small_world)
    folder = tmp_path_factory.mktemp("attributed")
    write_jsonl(folder / "episodes.jsonl", records)
    config = load_config(None, [f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}"])
    (folder / "config.json").write_text(json.dumps(config_to_dict(config), default=str))
    return folder, records


def test_the_viewer_filters_by_outcome_and_role_and_marks_the_first_wrong_turn(attributed_run, small_scenario, browser):
    """Driven in Chromium: the outcome and lost-by filters show exactly the episodes of that outcome / role,
    and each lost episode marks one turn, checked against the record without the attribution's own code:
    a sub-agent's wrong report is its last turn, a result that is not the gold answer of the hop it was
    asked; an early answer is the main agent's answer turn; opening an episode scrolls the mark into view."""
    from mgrpo_env.attribution import LOST_BY, episode_outcome

    folder, records = attributed_run
    outcomes = [episode_outcome(r, small_scenario)[0] for r in records]
    assert {"right", "sub_wrong", "main_not_asked"} <= set(outcomes), outcomes  # the run has each kind
    assert main(["view", str(folder)]) == 0
    tab = browser.new_page(viewport={"width": 1200, "height": 700})
    tab.goto((folder / "view.html").resolve().as_uri())
    episodes = tab.locator("details.ep")

    def visible() -> list[int]:
        return [i for i in range(episodes.count()) if episodes.nth(i).is_visible()]

    for outcome in ("sub_wrong", "main_not_asked", "right"):
        tab.select_option("#outcome", outcome)
        assert visible() == [i for i, o in enumerate(outcomes) if o == outcome], outcome
        assert tab.inner_text("#shown") == str(outcomes.count(outcome))
    tab.select_option("#outcome", "all")
    for role in ("main", "sub"):
        tab.select_option("#lost-by", role)
        assert visible() == [i for i, o in enumerate(outcomes) if LOST_BY.get(o) == role], role
    tab.select_option("#lost-by", "all")
    assert episodes.nth(outcomes.index("right")).locator("li.turn.wrong").count() == 0
    checked = set()
    for i, (record, outcome) in enumerate(zip(records, outcomes, strict=True)):
        if outcome == "right":
            continue
        marked = episodes.nth(i).locator("li.turn.wrong")
        assert marked.count() == 1, (i, outcome)
        agent, turn = marked.get_attribute("data-agent"), int(marked.get_attribute("data-turn"))
        if outcome == "sub_wrong":
            sub = next(s for s in record.subs if s.agent == agent)
            hop = small_scenario.match_delegation(_task(record), sub.task).hop
            assert turn == len(sub.turns) - 1 and sub.turns[turn].kind == "result", i
            assert hop is not None and sub.final != record.task["hops"][hop]["answer"], i
            assert f"reported hop {hop} wrong" in marked.locator(".wrongmark").text_content()
        elif outcome == "main_not_asked" and record.main.turns[-1].kind == "answer":
            assert (agent, turn) == (record.main.agent, len(record.main.turns) - 1), i  # answered early
        checked.add(outcome)
    assert checked == {"sub_wrong", "main_not_asked"}
    # opening a lost episode brings its mark into view
    first = outcomes.index("sub_wrong")
    episodes.nth(first).locator("summary").first.click()
    top = episodes.nth(first).locator("li.turn.wrong").evaluate("e => e.getBoundingClientRect().top")
    assert 0 <= top <= 700
    tab.close()


def _task(record):
    from mgrpo_scenarios import Task

    return Task.from_dict(record.task)
