"""The rule behind MGRPO_NO_SKIPS=1 (tests/_no_skips.py): only a missing GPU may skip."""

from __future__ import annotations

import subprocess
import sys

from _no_skips import unexpected_skips


def test_only_gpu_reasons_are_allowed():
    skips = [("a::t1", "needs a CUDA device"), ("a::t2", "redis-server is not installed"), ("a::t3", "no GPU here"),
             ("a::t4", "could not import 'datasets'")]
    assert unexpected_skips(skips) == [("a::t2", "redis-server is not installed"), ("a::t4", "could not import 'datasets'")]


def test_a_skip_fails_the_session_only_when_asked(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})\n"
        "from _no_skips import register\n\ndef pytest_configure(config):\n    register(config)\n")
    (tmp_path / "test_x.py").write_text("import pytest\n\ndef test_a():\n    pytest.skip('redis-server is not installed')\n\n"
                                        "def test_b():\n    pytest.skip('needs a GPU')\n")
    import os

    run = lambda flag: subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],  # noqa: E731
                                      capture_output=True, text=True, cwd=tmp_path,
                                      env={**os.environ, "MGRPO_NO_SKIPS": flag})
    quiet, strict = run("0"), run("1")
    assert quiet.returncode == 0, quiet.stdout
    assert strict.returncode == 1 and "unexpected skip (MGRPO_NO_SKIPS=1): test_x.py::test_a: Skipped: redis-server is not installed" in strict.stdout
    assert "test_b" not in strict.stdout.split("unexpected skip")[-1]
