"""Question/answer tables from any file: GAIA's metadata.parquet, and the ``qa-file`` scenario over
JSONL, CSV, Parquet and ``datasets`` folders saved with ``save_to_disk`` (issue 17, part 3)."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mgrpo_scenarios
from mgrpo_algo.cli import main
from mgrpo_scenarios.qa_file import QAFile
from mgrpo_scenarios.tables import read_rows
from mgrpo_scenarios.web_qa import Gaia

GAIA_DIR = Path(__file__).parent / "fixtures" / "gaia"
ROWS = [
    {"id": "a1", "prompt": "Who wrote Hamlet?", "gold": "William Shakespeare", "level": 1},
    {"id": "a2", "prompt": "What is 6 times 7?", "gold": "42", "level": 2},
    {"id": "a3", "prompt": "Largest planet?", "gold": "Jupiter", "level": 1},
]


def write_all_formats(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {k: folder / f"qa.{k}" for k in ("jsonl", "json", "csv", "parquet")}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    paths["json"].write_text(json.dumps({"data": ROWS}))
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), paths["parquet"])
    return paths


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet"])
def test_qa_file_reads_every_format_by_named_columns(tmp_path, kind):
    path = write_all_formats(tmp_path)[kind]
    scenario = mgrpo_scenarios.get("qa-file", data=str(path), question_column="prompt", answer_column="gold",
                                   id_column="id")
    assert scenario.splits() == ["test"]
    tasks = list(scenario.tasks("test"))
    assert [(t.id, t.question, t.answer) for t in tasks] == [(r["id"], r["prompt"], r["gold"]) for r in ROWS]
    assert str(tasks[1].metadata["level"]) == "2"  # other columns kept (CSV gives strings)
    assert scenario.verify(tasks[0], "william shakespeare").correct
    assert not scenario.verify(tasks[0], "Marlowe").correct


def test_list_answers_become_aliases_and_ids_default_to_row_numbers(tmp_path):
    path = tmp_path / "multi.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "Capital of France?", "answer": ["Paris", "Lutetia"]}]), path)
    (task,) = QAFile(path).tasks()
    assert (task.id, task.answer, task.aliases) == ("qa-0", "Paris", ("Lutetia",))
    assert QAFile(path).verify(task, "Lutetia").correct


def test_a_missing_column_fails_at_once_naming_the_columns(tmp_path):
    path = write_all_formats(tmp_path)["parquet"]
    with pytest.raises(ValueError, match=r"question_column='question' is not a column .*columns: id, prompt, gold"):
        QAFile(path, answer_column="gold")


def test_saved_datasets_load_with_and_without_the_datasets_library(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    single = tmp_path / "single"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(single))
    both = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:2]),
                          "test": datasets.Dataset.from_list(ROWS[2:])}).save_to_disk(str(both))
    scenario = QAFile(single, question_column="prompt", answer_column="gold")
    assert [t.answer for t in scenario.tasks()] == ["William Shakespeare", "42", "Jupiter"]
    split_scenario = QAFile(both, question_column="prompt", answer_column="gold")
    assert split_scenario.splits() == ["train", "test"] and split_scenario.default_split == "test"
    assert [t.answer for t in split_scenario.tasks("train")] == ["William Shakespeare", "42"]
    assert [t.answer for t in split_scenario.tasks("test")] == ["Jupiter"]
    with pytest.raises(ValueError, match="no split 'dev'"):
        QAFile(both, question_column="prompt", answer_column="gold", split="dev")
    monkeypatch.setitem(sys.modules, "datasets", None)  # the pyarrow path reads the Arrow files itself
    assert read_rows(single) == ROWS
    assert read_rows(both, "test") == ROWS[2:]
    with pytest.raises(ValueError, match="name one"):
        read_rows(both)


def test_gaia_reads_metadata_parquet_like_jsonl(tmp_path):
    folder = tmp_path / "gaia" / "2023" / "validation"
    shutil.copytree(GAIA_DIR / "2023" / "validation", folder)
    rows = read_rows(folder / "metadata.jsonl")
    (folder / "metadata.jsonl").unlink()
    pq.write_table(pa.Table.from_pylist(rows), folder / "metadata.parquet")
    from_parquet = list(Gaia(tmp_path / "gaia").tasks("validation"))
    from_jsonl = list(Gaia(GAIA_DIR).tasks("validation"))
    assert [t.to_dict() for t in from_parquet] == [
        {**t.to_dict(), "metadata": {**t.metadata, "file_path": p.metadata["file_path"]}}
        for t, p in zip(from_jsonl, from_parquet, strict=True)
    ]
    assert any(p.metadata["file_path"] for p in from_parquet)  # attachments found next to the parquet
    assert Gaia(folder / "metadata.parquet").splits() == ["validation"]


def test_cli_eval_on_a_qa_file(tmp_path, capsys):
    path = write_all_formats(tmp_path)["parquet"]
    args = ["eval", "--scenario", "qa-file", "--data", str(path), "--set", "question_column=prompt",
            "--set", "answer_column=gold", "--set", "searxng_url=http://127.0.0.1:1", "--set", "cache_path=false",
            "--set", "browser_mode=never", "--agent", "random", "--quiet", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_tasks"] == 3 and summary["scenario"] == "qa-file"
    assert main(args[:5] + ["--set", "question_column=q"]) == 2
    assert "columns: id, prompt, gold" in capsys.readouterr().err
