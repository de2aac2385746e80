"""The wiki-hops tiny profile: compact observations, goal-matching evidence, by-name visits, world tokens,
and the warm-start levers built for tiny models (relabelling, warmup + cosine)."""

from __future__ import annotations

import random

import pytest

from mgrpo_env.protocol import MAIN_TOOLS, SUB_TOOLS, system_prompt
from mgrpo_tools.html_text import Document, relevant_lines

PAGE = Document(
    url="http://x.test/wiki/Orvel_Dunmarch",
    title="Orvel Dunmarch",
    text="# Orvel Dunmarch\nOrvel Dunmarch\nType | Person\nBorn in | Velmora [2]\nBirth year | 1911\n"
         "Born in Velmora [2] in 1911, Orvel Dunmarch travelled widely.\nOrvel Dunmarch wrote letters.",
    links=[],
)


def test_relevant_lines_rank_the_goal_line_first_and_ignore_title_words():
    assert relevant_lines(PAGE, "born_in of Orvel Dunmarch", 2)[0] == "Born in | Velmora"  # link marker gone
    assert relevant_lines(PAGE, "birth_year of Orvel Dunmarch", 1) == ["Birth year | 1911"]
    assert relevant_lines(PAGE, "Orvel Dunmarch", 3) == []  # the subject's name is no evidence
    assert relevant_lines(PAGE, "spouse of Orvel Dunmarch", 3) == []  # nothing matches: nothing returned
    assert relevant_lines(PAGE, "born_in", 0) == []


def test_compact_prompts_are_short_and_name_the_tools():
    for role, tools in (("main", MAIN_TOOLS), ("sub", SUB_TOOLS)):
        compact, full = system_prompt(role, tools, "compact"), system_prompt(role, tools)
        assert len(compact) < 80 < len(full)
        assert all(name in compact for name in tools) and ("<answer>" if role == "main" else "<result>") in compact
    with pytest.raises(ValueError, match="prompt style"):
        system_prompt("main", MAIN_TOOLS, "verbose")


def test_profile_settings_and_refusals(tiny):
    from mgrpo_scenarios.wiki_hops import WikiHops

    assert (tiny.page_chars, tiny.search_k, tiny.prompt_style, tiny.metadata["profile"]) == (200, 3, "compact", "tiny")
    full = WikiHops(seed=0, num_entities=300, data_dir=tiny.data_dir)
    assert (full.page_chars, full.search_k, full.prompt_style) == (4000, 5, "full")
    assert full.world_tokens() == [] and full.world_token_groups() == {}
    assert WikiHops(seed=0, num_entities=300, profile="tiny", search_k=5, data_dir=tiny.data_dir).search_k == 5
    with pytest.raises(ValueError, match="profile"):
        WikiHops(profile="huge")


def test_tiny_tools_show_evidence_and_no_snippets(tiny, tiny_world):
    task = next(iter(tiny.tasks("stage1/test")))
    hop = task.hops[0]
    found = tiny_world.tools["search"]({"queries": [hop.entity]})
    assert found.ok and f"[1] {hop.entity}" in found.text
    assert len(found.text.splitlines()) == 1 + 2 * 3  # header + (title, URL) per hit: no snippets
    seen = tiny_world.tools["visit"]({"url": tiny.page_url(hop.entity), "goal": f"{hop.relation} of {hop.entity}"})
    assert seen.ok and seen.meta["relevant_lines"] == 1
    label, _, value = seen.text.partition(" | ")
    assert "|" not in value and value.replace(",", "") == hop.answer  # only the evidence line, the answer in it
    assert seen.meta["url"].endswith(hop.entity.replace(" ", "_"))  # the by-name URL lands on the slug


def test_tiny_oracle_solves_one_hop_questions_by_name(tiny, tiny_world):
    from mgrpo_env.rollout import collect
    from mgrpo_env.scripted import OraclePolicy

    tasks = list(tiny.tasks("stage1/test"))[:12]
    records = collect(tiny, tasks, 1, {"main": OraclePolicy(tiny, "main"), "sub": OraclePolicy(tiny, "sub")}, world=tiny_world)
    assert all(r.correct for r in records)
    visits = [m["content"] for r in records for s in r.subs for m in s.messages if '"visit"' in m["content"]]
    assert visits and all("wiki-hops.test/wiki/" in v and "_" not in v.split("/wiki/")[1].split('"')[0] for v in visits)
    assert records[0].main.messages[0]["content"] == system_prompt("main", MAIN_TOOLS, "compact")
    singles = collect(tiny, tasks, 1, {"single": OraclePolicy(tiny, "single")}, world=tiny_world, env_kwargs={"max_turns": 24}, env="single")
    assert all(r.correct for r in singles)


def test_world_tokens_make_names_values_and_urls_one_token(tiny, tmp_path):
    from mgrpo_algo.policies.models import train_tokenizer

    tokens = tiny.world_tokens()
    entity = tiny.graph().entities[7]
    assert {entity.name, entity.slug, "http://wiki-hops.test/wiki/", "born_in"} <= set(tokens)
    tokenizer = train_tokenizer(["In which industry does it operate? " * 20, "opera house"], vocab_size=300,
                                world_tokens=tokens)
    for text in (entity.name, entity.slug, "http://wiki-hops.test/wiki/"):
        assert len(tokenizer.encode(text, add_special_tokens=False)) == 1, text
    url = f"http://wiki-hops.test/wiki/{entity.name}"
    assert len(tokenizer.encode(url, add_special_tokens=False)) == 2
    operate = tokenizer.encode(" operate", add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("opera") not in operate  # whole words only
    assert tokenizer.decode(tokenizer.encode(url + " operate", add_special_tokens=False)) == url + " operate"


def test_relabeled_keeps_copies_consistent():
    from mgrpo_algo.learning.warmstart import Relabeled

    groups = [[(10, 11), (20, 21), (30, 31)], [(100,), (200,)]]  # (name, slug) pairs; values
    ids, mask = [1, 10, 2, 11, 100, 10, 3], [0, 0, 0, 1, 0, 1, 1]
    seen = set()
    relabeled = Relabeled([(ids, mask)], groups, seed=0)
    for _ in range(40):
        out, out_mask = relabeled[0]
        assert out_mask == mask and len(out) == len(ids)
        assert out[0] == 1 and out[2] == 2 and out[6] == 3  # other tokens untouched
        assert out[1] == out[5] and out[3] == out[1] + 1  # the name everywhere the same, its slug follows
        seen.add((out[1], out[4]))
    assert {n for n, _ in seen} == {10, 20, 30} and {v for _, v in seen} == {100, 200}


def test_lr_schedule_and_role_epochs():
    from mgrpo_algo.core.config import WarmStartConfig
    from mgrpo_algo.learning.warmstart import lr_factor

    assert [lr_factor(s, 100, 10, 0.1) for s in (0, 9)] == [pytest.approx(0.1), pytest.approx(1.0)]
    assert lr_factor(10, 100, 10, 0.1) == pytest.approx(1.0) and lr_factor(100, 100, 10, 0.1) == pytest.approx(0.1)
    assert lr_factor(55, 100, 10, 0.1) == pytest.approx(0.55)  # half-way down the cosine
    cfg = WarmStartConfig(epochs=3, role_epochs={"main": 6})
    assert (cfg.epochs_for("main"), cfg.epochs_for("sub")) == (6.0, 3.0)
    for bad in ({"role_epochs": {"boss": 1}}, {"beta2": 1.0}, {"min_lr_ratio": 2.0}, {"warmup_steps": -1}):
        with pytest.raises(ValueError, match="warm_start"):
            WarmStartConfig(**bad)


def test_sft_train_runs_the_schedule_and_fractional_epochs(tmp_path):
    import torch

    from mgrpo_algo.core.config import WarmStartConfig
    from mgrpo_algo.learning.warmstart import sft_train
    from mgrpo_algo.policies.models import build_tiny_model, train_tokenizer

    tokenizer = train_tokenizer(["a b c d e f g"] * 10, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    rng = random.Random(0)
    sequences = [([rng.randrange(3, 200) for _ in range(12)], [0] * 6 + [1] * 6) for _ in range(8)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = WarmStartConfig(epochs=2, lr=1e-2, batch_tokens=64, warmup_steps=2, min_lr_ratio=0.0)
    stats = sft_train(model, sequences, cfg, pad_id=0, progress=False, epochs=1.5)
    assert stats["steps"] == 3  # 2 batches (5 + 3 sequences) per epoch, 1.5 epochs
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert sft_train(model, sequences, cfg, pad_id=0, progress=False, epochs=0)["steps"] == 0


def test_a_count_hop_is_one_evidence_line_with_the_lists_size(tiny, tiny_world):
    # world version 3: the infobox's "Number of ... | N" row. Before it, the tiny visit of a count goal showed
    # the first 200 characters of the page, and the oracle's sub-agent reported 0 for every count.
    from mgrpo_scenarios.wiki_hops.world import REVERSE_BY_KEY

    hops = [h for t in tiny.tasks("stage2/test") if t.kind == "aggregation" for h in t.hops if h.relation in REVERSE_BY_KEY]
    assert len(hops) >= 10
    for hop in hops[:10]:
        seen = tiny_world.tools["visit"]({"url": tiny.page_url(hop.entity), "goal": f"{hop.relation} of {hop.entity}"})
        assert seen.ok and seen.text.strip() == f"{REVERSE_BY_KEY[hop.relation].count_label} | {hop.answer}"
        assert int(hop.answer) >= 1


def test_tiny_oracle_answers_the_counting_questions(tiny, tiny_world):
    from mgrpo_env.rollout import collect
    from mgrpo_env.scripted import OraclePolicy

    tasks = [t for t in tiny.tasks("stage2/test") if t.kind == "aggregation" and len(t.hops) <= 3][:12]
    assert len(tasks) == 12
    records = collect(tiny, tasks, 1, {"main": OraclePolicy(tiny, "main"), "sub": OraclePolicy(tiny, "sub")}, world=tiny_world)
    assert [r.final_answer for r in records] == [t.answer for t in tasks]
    assert all(r.correct for r in records)
