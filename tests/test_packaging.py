"""The installable packages: every source folder with an ``__init__.py`` is listed in pyproject.toml, so
a wheel (``pip install .``, not only an editable install) carries every module."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_in_the_wheel() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the project supports 3.10
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    folders = {name: ROOT / setup.get("package-dir", {}).get(name, name) for name in listed if "." not in name}
    found = set()
    for top, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder)
            if "__pycache__" not in relative.parts:
                found.add(".".join((top, *relative.parts)))
    assert found - listed == set(), f"packages missing from pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages without a folder: {sorted(listed - found)}"
