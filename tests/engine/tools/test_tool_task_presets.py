"""Both tiny tool tasks as presets: each task's ``tiny://<name>/*`` URIs and its
``grpo_tiny_<name>`` preset, the command measured in docs/results.md with its files named by URI.

A task takes a few CPU minutes to build, so these tests resolve the URIs against a fake task
folder (the task's ``ensure_*`` function patched); the tasks' own files test the builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from engine.config import config_to_dict, get_value, load_config, set_value
from engine.roles.model_loading import resolve_path
from engine.tools import tiny_interpreter_task, tiny_task
from engine.tools.tiny_uris import (
    CALCULATOR_URIS,
    INTERPRETER_URIS,
    resolve_tiny_uri,
    tiny_uris,
)
from engine.tools.tool_task import ToolTask
from tests.engine.tools.task_fixtures import fake_task_folder, path_keys

# docs/results.md, both tasks' runs: what the command adds to the task's overrides.
MEASURED = [
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "trainer.total_training_steps=20",
    "trainer.test_freq=10",
    "data.val_max_samples=64",
    "trainer.save_freq=-1",
]


@dataclass(frozen=True)
class Declared:
    """Where a tool task is declared: its module, the module's ``ensure_*`` and its URIs."""

    module: ModuleType
    ensure: str
    task: ToolTask
    uris: tuple[str, ...]

    @property
    def preset(self) -> str:
        return f"grpo_tiny_{self.task.name}"


DECLARED = [
    pytest.param(
        Declared(
            tiny_task, "ensure_calculator_task", tiny_task.CALCULATOR_TASK, tuple(CALCULATOR_URIS)
        ),
        id="calculator",
    ),
    pytest.param(
        Declared(
            tiny_interpreter_task,
            "ensure_interpreter_task",
            tiny_interpreter_task.INTERPRETER_TASK,
            tuple(INTERPRETER_URIS),
        ),
        id="interpreter",
    ),
]


@pytest.fixture(params=DECLARED)
def declared(request) -> Declared:
    return request.param


@pytest.fixture
def fake_task(declared, tmp_path, monkeypatch) -> SimpleNamespace:
    """Return a fake build of the task, which its ``ensure_*`` function now returns."""
    root = tmp_path / f"tiny_{declared.task.name}"
    return fake_task_folder(
        monkeypatch, root, declared.module, declared.ensure, declared.task.tools_yaml
    )


def test_the_tasks_uris_resolve_to_the_built_task(declared, fake_task, tmp_path):
    folder, name = fake_task.folder, declared.task.name
    expected = {
        f"tiny://{name}/model": folder / "model",
        f"tiny://{name}/train.parquet": folder / "data" / "train.parquet",
        f"tiny://{name}/val.parquet": folder / "data" / "val.parquet",
        f"tiny://{name}/tools.yaml": folder / "tools.yaml",
    }
    assert set(declared.uris) == set(expected) and set(declared.uris) < set(tiny_uris())
    for uri, path in expected.items():
        # resolve_path is what every model, data and checkpoint key reads.
        assert resolve_tiny_uri(uri) == str(path) == resolve_path(uri) and Path(path).exists()
    assert resolve_tiny_uri(f"tiny://{name}/model", tmp_path / "d") == str(folder / "model")
    assert fake_task.calls[-1] == tmp_path / "d"  # the data folder reaches ensure_*
    assert resolve_tiny_uri("/data/x.parquet") == "/data/x.parquet"
    assert "tiny://model" in tiny_uris()


@pytest.mark.parametrize("tail", ["/nope", "/", ""])
def test_an_unknown_uri_names_every_valid_one_and_builds_nothing(declared, fake_task, tail):
    with pytest.raises(ValueError, match="unknown embedded asset") as info:
        resolve_path(f"tiny://{declared.task.name}{tail}")
    assert all(known in str(info.value) for known in tiny_uris())
    assert fake_task.calls == []


def test_the_preset_is_the_measured_command_on_the_tasks_uris(declared, fake_task):
    name = declared.task.name
    preset = load_config(declared.preset)
    named = {key: get_value(preset, key) for key in path_keys() if get_value(preset, key)}
    assert named == {
        "data.train_files": f"tiny://{name}/train.parquet",
        "data.val_files": f"tiny://{name}/val.parquet",
        "actor_rollout_ref.model.path": f"tiny://{name}/model",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": f"tiny://{name}/tools.yaml",
    }
    assert all(Path(resolve_path(v)).is_relative_to(fake_task.folder) for v in named.values())
    # The rows' data source picks the task's scorer in the default dispatch: no custom reward.
    assert preset.custom_reward_function.path is None and not preset.reward.components
    measured = load_config("grpo_tiny", [*declared.task.overrides(fake_task.folder), *MEASURED])
    for key in named:
        set_value(preset, key, resolve_path(get_value(preset, key)))
    assert config_to_dict(preset) == config_to_dict(measured)
