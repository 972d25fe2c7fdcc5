"""Shared pieces of the tool-task tests: a fake built task, and the keys that name paths."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from engine.config.keys import resolve_key, schema_keys


def fake_task_folder(
    monkeypatch: pytest.MonkeyPatch, root: Path, module: ModuleType, ensure: str, tools_yaml: str
) -> SimpleNamespace:
    """Lay out a fake built task under ``root``, make ``module.<ensure>`` return it, and return
    its ``folder`` and the data folders ``ensure`` was ``calls``-ed with."""
    folder = root / "0123456789abcdef"
    (folder / "model").mkdir(parents=True)
    (folder / "data").mkdir()
    for name in ("train", "val"):
        (folder / "data" / f"{name}.parquet").write_bytes(b"PAR1")
    (folder / "tools.yaml").write_text(tools_yaml)
    calls: list[Path | None] = []

    def fake_ensure(data_dir: Path | None = None) -> Path:
        calls.append(data_dir)
        return folder

    monkeypatch.setattr(module, ensure, fake_ensure)
    return SimpleNamespace(folder=folder, calls=calls)


def path_keys() -> list[str]:
    """Return the schema's keys that name a file or folder (``resource="path"``)."""
    return [
        key
        for key in schema_keys()
        if (field := resolve_key(key).field) is not None
        and field.metadata.get("resource") == "path"
    ]
