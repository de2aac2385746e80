"""Every Python block of the README and the docs runs as written (each in its own process, with a
timeout), so none can rot. A block that cannot run here says why on its first line,
``# not run: needs a GPU`` (the reason must name what it needs); a block that only includes a file
(``--8<-- "examples/..."``) shows an example that tests/test_examples.py or test_extend_examples.py runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"^# not run: (?P<reason>.*)$")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')
EXAMPLE_TESTS = ("tests/test_examples.py", "tests/test_extend_examples.py")


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each fenced ```python block, indented ones (inside an admonition) dedented."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group("body"))) for m in FENCE.finditer(text)]


BLOCKS = [(path, line, code) for path in DOCS for line, code in python_blocks(path)]


def block_id(block: tuple[Path, int, str]) -> str:
    return f"{block[0].relative_to(ROOT)}:{block[1]}"


def not_run_reason(code: str) -> str | None:
    """The reason of a ``# not run: ...`` first line; None when the block runs."""
    found = NOT_RUN.match(code.lstrip().splitlines()[0]) if code.strip() else None
    return found.group("reason").strip() if found else None


def test_the_docs_have_python_blocks_and_the_readme_runs_some():
    assert len(BLOCKS) >= 8, [block_id(b) for b in BLOCKS]
    readme = [b for b in BLOCKS if b[0].name == "README.md"]
    assert readme and all(not_run_reason(code) is None for _, _, code in readme)


def test_a_not_run_marker_must_name_what_the_block_needs():
    for reason in ("", "later", "slow"):
        assert not re.match(r"needs \w+", reason)
    for block in BLOCKS:
        reason = not_run_reason(block[2])
        if reason is not None:
            assert re.match(r"needs (a |an |the )?\w+", reason), f"{block_id(block)}: '# not run: {reason}' names no need"


@pytest.fixture(scope="module")
def block_env(small_scenario) -> dict[str, str]:
    """The blocks' environment: the session's 300-entity world already built, one thread each."""
    return {**os.environ, "MGRPO_DATA_DIR": str(small_scenario.data_dir), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.timeout(600)  # the README's training block: ~40 s on 2 quiet cores, 220 s measured on saturated ones
@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_block_runs(block: tuple[Path, int, str], block_env: dict[str, str], tmp_path: Path) -> None:
    path, line, code = block
    if not_run_reason(code) is not None:
        return  # checked by test_a_not_run_marker_must_name_what_the_block_needs
    include = INCLUDE.match(code.strip())
    if include:
        shown = include.group("path")
        assert (ROOT / shown).is_file(), f"{block_id(block)} includes {shown}, which does not exist"
        assert any(Path(shown).name in (ROOT / t).read_text() for t in EXAMPLE_TESTS), \
            f"{block_id(block)} shows {shown}, which no example test runs"
        return
    script = tmp_path / "block.py"
    script.write_text(code)
    # the blocks write under runs/ (relative paths, as a user's would): run them in a scratch copy's cwd
    # that links to the repository's configs, so nothing lands in the checkout
    work = tmp_path / "cwd"
    work.mkdir()
    for name in ("configs", "examples", "benchmarks"):
        (work / name).symlink_to(ROOT / name)
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=block_env, capture_output=True, text=True,
                          timeout=540)
    assert done.returncode == 0, f"{block_id(block)} exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
