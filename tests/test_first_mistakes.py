"""The first hour's mistakes fail fast, in one line, naming what is wrong (issue 17, part 4)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mgrpo_algo.cli import main
from mgrpo_algo.core.config import load_config
from mgrpo_algo.training.preflight import PreflightError, check_store, check_writable, preflight


def test_eval_missing_data_is_one_line_naming_the_path_exit_2(tmp_path):
    missing = tmp_path / "nonexistent"
    done = subprocess.run([sys.executable, "-m", "mgrpo_algo.cli", "eval", "--scenario", "gaia", "--data", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0], done.stderr


@pytest.mark.parametrize(
    ("override", "field", "expected"),
    [("group_size=abc", "group_size", "int"), ("main.learner.lr=fast", "main.learner.lr", "float"),
     ("checkpoint=1", "checkpoint", "bool"), ("limits=3", "limits", "a mapping (a section: max_main_turns"),
     ("limits.max_main_turns=many", "limits.max_main_turns", "int"),
     ("main.learner.max_grad_norm=x", "main.learner.max_grad_norm", "float or None")],
)
def test_set_with_a_wrong_type_names_field_and_type(override, field, expected, capsys):
    assert main(["train", "--set", override]) == 2
    err = capsys.readouterr().err
    assert f"'{field}' must be {expected}," in err and "not supported between" not in err


def test_set_values_are_coerced_where_lossless():
    config = load_config(None, ["main.learner.lr=1e-4", "main_weights=[1, 0]", "eval.temperature=1",
                                "main.learner.max_grad_norm=null", "main.learner.lora_targets=q_proj"])
    assert config.main.learner.lr == 1e-4 and isinstance(config.main.learner.lr, float)  # YAML reads 1e-4 as a str
    assert config.main_weights == (1.0, 0.0) and config.eval.temperature == 1.0
    assert config.main.learner.max_grad_norm is None and config.main.learner.lora_targets == ("q_proj",)
    with pytest.raises(ValueError, match="'main_weights' needs 2 values"):
        load_config(None, ["main_weights=[1, 2, 3]"])
    with pytest.raises(ValueError, match=r"'stages\[0\].iterations' must be int"):
        load_config(None, ["stages=[{split: stage1/train, iterations: two}]"])


def test_unreachable_store_fails_before_any_model_is_built(tmp_path, capsys):
    models = tmp_path / "models"
    start = time.perf_counter()
    code = main(["train", "--store", "redis://127.0.0.1:1", "--placement", "processes",
                 "--set", f"out_dir={tmp_path / 'out'}", "--set", f"models_dir={models}"])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2 and "redis://127.0.0.1:1" in err and "unreachable" in err
    assert elapsed < 10, elapsed
    assert not models.exists() and not (tmp_path / "out").exists()


def test_preflight_names_the_folder_the_store_and_the_split(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(PreflightError, match="afile"):
        check_writable(afile / "out", "output folder")
    check_writable(tmp_path / "new" / "deeper", "output folder")  # creatable: fine, and not created
    assert not (tmp_path / "new").exists()
    with pytest.raises(PreflightError, match="sqlite:PATH"):
        check_store("mysql://x")
    with pytest.raises(PreflightError, match="afile"):
        check_store(f"sqlite:{afile}/stats.db")
    check_store(f"sqlite:{tmp_path}/stats.db")
    config = load_config(None, [f"out_dir={tmp_path}/o", f"models_dir={tmp_path}/m", "stages=[{split: stage9/train}]"])
    with pytest.raises(PreflightError, match=r"'stages\[0\].split'.*stage9/train"):
        preflight(config)
    # a stage may mix splits ('+'): each part must exist
    config = load_config(None, [f"out_dir={tmp_path}/o", f"models_dir={tmp_path}/m",
                                "stages=[{split: stage1/train+stage9/train}]"])
    with pytest.raises(PreflightError, match=r"'stages\[0\].split'.*has no split 'stage9/train'"):
        preflight(config)
    preflight(load_config(None, [f"out_dir={tmp_path}/o", f"models_dir={tmp_path}/m",
                                 "stages=[{split: stage1/train+stage2/train}]"]))
    config = load_config(None, [f"out_dir={tmp_path}/o", f"models_dir={tmp_path}/m", "scenario=gaia",
                                f"scenario_kwargs={{data: {tmp_path}/missing}}"])
    with pytest.raises(PreflightError, match="missing"):
        preflight(config)
    preflight(load_config(None, [f"out_dir={tmp_path}/o", f"models_dir={tmp_path}/m"]), check_eval=True)
