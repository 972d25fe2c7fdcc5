"""``pip install ./posttrain_client`` makes a package of the client alone: httpx its only
requirement, the ``posttrain`` command, and no module that needs torch or Django."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "posttrain_client"
# Modules a trainer brings along: the TRL callback needs TRL (and so transformers).
TRAINER_MODULES = {"trl.py"}


@pytest.mark.slow
def test_the_client_builds_into_a_wheel_of_its_own(tmp_path):
    source = tmp_path / "posttrain_client"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("posttrain_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert {f"posttrain_client/{m}" for m in modules} <= names
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["Requires-Dist: httpx<1,>=0.27"]
    assert "posttrain = posttrain_client.cli:main" in entry_points


def top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_client_imports_only_the_standard_library_and_httpx():
    allowed = set(sys.stdlib_module_names) | {"httpx", "posttrain_client"}
    for path in PACKAGE.glob("*.py"):
        if path.name in TRAINER_MODULES:
            continue
        extra = top_level_imports(path) - allowed
        assert not extra, f"{path.name} imports {sorted(extra)} when loaded"
