"""Every JSON file a run writes is strict JSON (issue 53): a figure not measured is ``null``, never
``NaN``, which jq, browsers and ``JSON.parse`` refuse. The helper by value, then a real ``mgrpo compare``
whose greedy EM is not measured (``eval.greedy: false`` at a temperature > 0), every ``.json`` and
``.jsonl`` file under its folder read back with a strict reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mgrpo_env.strict_json import dumps, finite, loads_strict


def test_non_finite_numbers_are_written_null_and_a_strict_reader_refuses_nan():
    value = {"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"), 2)], "c": np.float64("nan"),
             "d": np.float32(0.5), "e": "NaN", "f": None, "g": 3, "h": True}
    assert finite(value) == {"a": None, "b": [1.5, None, [None, 2]], "c": None, "d": 0.5, "e": "NaN", "f": None,
                             "g": 3, "h": True}
    text = dumps(value, sort_keys=True)
    assert loads_strict(text) == finite(value)
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    for bad in ('{"x": NaN}', "[Infinity]", "[-Infinity]"):
        with pytest.raises(ValueError, match=r"^not strict JSON: -?(NaN|Infinity) \(write null\)$"):
            loads_strict(bad)
    # what a default= hook returns is written as it is: a non-finite one raises instead of writing NaN
    with pytest.raises(ValueError, match="Out of range float"):
        dumps({"x": object()}, default=lambda o: float("nan"))


def test_episode_records_and_metrics_lines_are_strict(tmp_path):
    from mgrpo_env.episode import EpisodeRecord, read_jsonl, write_jsonl

    record = EpisodeRecord(episode_id="e", task={"id": "t"}, score=float("nan"), components={"sub_0": {"expert": math.inf}})
    write_jsonl(tmp_path / "episodes.jsonl", [record])
    line = loads_strict((tmp_path / "episodes.jsonl").read_text())
    assert line["score"] is None and line["components"] == {"sub_0": {"expert": None}}
    assert next(read_jsonl(tmp_path / "episodes.jsonl")).components == {"sub_0": {"expert": None}}


def _strict_files(folder: Path) -> dict[str, int]:
    """Each .json / .jsonl file under ``folder`` read with the strict reader: its path -> documents read."""
    read = {}
    for path in sorted([*folder.rglob("*.json"), *folder.rglob("*.jsonl")]):
        text = path.read_text(encoding="utf-8")
        docs = [line for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else [text]
        for doc in docs:
            try:
                loads_strict(doc)
            except ValueError as exc:
                raise AssertionError(f"{path.relative_to(folder)}: {exc}") from exc
        read[str(path.relative_to(folder))] = len(docs)
    return read


def test_every_json_file_a_compare_run_writes_parses_strictly(small_scenario, tmp_path):
    from mgrpo_algo.cli import main

    sizes = "{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}"
    out = tmp_path / "out"
    settings = [
        f"models_dir={tmp_path / 'models'}", f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}",
        f"model_sizes={{main: {sizes}, sub: {sizes}, single: {sizes}}}",
        "warm_start={epochs: 1, max_tasks: 4, splits: [stage1/train]}", "stages=[{split: stage2/train, iterations: 1}]",
        "questions_per_iteration=2", "group_size=2", "limits={max_main_turns: 2, max_sub_turns: 2, max_delegations: 1}",
        *(f"{role}.generation.max_new_tokens=12" for role in ("main", "sub")),
        "eval.limit=2", "eval.curve_limit=2", "eval.temperature=0.7", "eval.greedy=false",  # greedy EM: not measured
        "checkpoint=false",
    ]
    args = ["compare", "--seeds", "1", "--modes", "mgrpo", "--out", str(out)]
    for item in settings:
        args += ["--set", item]
    assert main(args) == 0
    read = _strict_files(out)
    # the files a run writes, each read strictly: the summary, the run's config, metrics and episodes
    assert {"summary.json", "seed0/mgrpo/config.json", "seed0/mgrpo/metrics.jsonl", "seed0/mgrpo/episodes.jsonl",
            "seed0/mgrpo/eval_before.jsonl", "seed0/mgrpo/eval_after.jsonl"} <= set(read), sorted(read)
    summary = loads_strict((out / "summary.json").read_text())
    row = summary["results"]["mgrpo"]["per_seed"][0]
    assert row["before"]["greedy_em"] is None and row["after"]["greedy_em"] is None  # not measured: null
    assert summary["results"]["mgrpo"]["mean"]["after_greedy"] is None
    assert isinstance(row["after"]["em"], float)  # what was measured stays a number
    report = (out / "report.md").read_text()
    assert "nan" not in report.lower().replace("nano", "")
    json.loads((out / "summary.json").read_text())  # and the plain reader agrees
