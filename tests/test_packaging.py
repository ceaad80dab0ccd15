"""What ``pip install`` puts in site-packages: every package of ours, under names of ours."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed():
    # The package list is explicit (models/ is installed under another name): a new
    # subpackage missing from it would be left out of the wheel silently.
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "remat_kit").rglob("__init__.py")
    }
    listed = set(_setuptools()["packages"])
    assert found <= listed
    assert "remat_kit_models" in listed


def test_the_presets_are_installed_under_a_name_of_ours():
    tool = _setuptools()
    assert tool["package-dir"] == {"remat_kit_models": "models"}
    tops = {name.split(".")[0] for name in tool["packages"]}
    assert tops == {"remat_kit", "remat_kit_models"}  # never a generic "models"


def test_the_installed_presets_are_the_repository_folder():
    import remat_kit_models

    assert Path(remat_kit_models.__file__).resolve() == ROOT / "models" / "__init__.py"
