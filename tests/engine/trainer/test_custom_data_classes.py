"""data.custom_cls and data.sampler in a run (tiny model, CPU): the user's dataset class gives
the prompts, their sampler the order, and a curriculum sampler's update gets every step's batch."""

from __future__ import annotations

import textwrap

import pytest

from engine import main_ppo
from engine.config import ConfigValidationError, validate_config
from engine.data.custom import CustomPrompts
from engine.trainer import PPOTrainer
from tests.engine.tiny_run import short_run
from tests.engine.trainer.test_trainer import ListRecorder

# Reads the parquet files itself and keeps the questions starting with a 1 (verl's rows).
DATASET = """
import pyarrow.parquet as pq
from torch.utils.data import Dataset


class OnesDataset(Dataset):
    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        self.data_files, self.max_prompt_length = data_files, config.get("max_prompt_length")
        rows = [r for f in data_files for r in pq.read_table(f).to_pylist()]
        self.rows = [r for r in rows if r["prompt"][0]["content"].startswith("1")]
        self.batch_ends = 0

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = dict(self.rows[i])
        row["raw_prompt"] = row.pop("prompt")
        row["extra_info"] = {**row["extra_info"], "via": "OnesDataset"}
        return row

    def on_batch_end(self, batch):
        self.batch_ends += 1
"""

# The last rows first; remembers every batch update() was given.
SAMPLER = """
from engine.data.sampler import AbstractCurriculumSampler


class LastFirst(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.size, self.seed = len(data_source), data_config.seed
        self.updates = []

    def __iter__(self):
        return iter(range(self.size - 1, -1, -1))

    def __len__(self):
        return self.size

    def update(self, batch):
        self.updates.append(sorted(set(batch.non_tensor_batch["index"].tolist())))
"""


@pytest.fixture
def class_files(tmp_path):
    (tmp_path / "ones.py").write_text(textwrap.dedent(DATASET))
    (tmp_path / "last_first.py").write_text(textwrap.dedent(SAMPLER))
    return tmp_path


def test_the_custom_dataset_class_gives_the_prompts(make_config, class_files, tiny_assets):
    config = make_config(
        "grpo_tiny",
        f"data.custom_cls.path={class_files / 'ones.py'}",
        "data.custom_cls.name=OnesDataset",
    )
    trainer = PPOTrainer(config)
    source = trainer.train_dataset.source
    assert isinstance(trainer.train_dataset, CustomPrompts)
    assert source.data_files == [str(tiny_assets.train_parquet)]
    assert source.max_prompt_length == config.data.max_prompt_length
    assert isinstance(trainer.val_dataset, CustomPrompts)  # the validation files too, as verl
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    assert len(recorder.steps) == 2
    assert all("|>1" in s.prompt_text for s in recorder.samples)
    assert {s.data_source for s in recorder.samples} == {"tiny_arithmetic"}
    assert source.batch_ends == 1  # verl's on_batch_end: after every step but the last


def test_the_sampler_sets_the_order_and_a_curriculum_sampler_learns_each_step(
    make_config, class_files
):
    config = make_config(
        "grpo_tiny",
        f"data.sampler.class_path={class_files / 'last_first.py'}",
        "data.sampler.class_name=LastFirst",
        "data.dataloader_num_workers=0",
    )
    trainer = PPOTrainer(config)
    sampler = trainer.train_loader.sampler
    size, batch = len(trainer.train_dataset), config.data.train_batch_size
    assert sampler.seed == config.data.seed  # built with the data section, as verl
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    # Step 1 took the last `batch` rows, step 2 the ones before them; update saw each step.
    assert sampler.updates == [
        list(range(size - batch, size)),
        list(range(size - 2 * batch, size - batch)),
    ]


def test_a_sampler_needs_no_loader_workers_and_a_class_needs_its_file(tiny_config, class_files):
    sampler = [
        f"data.sampler.class_path={class_files / 'last_first.py'}",
        "data.sampler.class_name=LastFirst",
    ]
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(tiny_config("grpo_tiny", *sampler))
    ((key, message),) = [(e.key, e.message) for e in caught.value.errors]
    assert key == "data.dataloader_num_workers"
    assert message.endswith("set data.dataloader_num_workers=0")
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(
            tiny_config(
                "grpo_tiny",
                f"data.custom_cls.path={class_files / 'missing.py'}",
                "data.sampler.class_name=LastFirst",
            ),
            check_files=True,
        )
    assert {e.key: e.message for e in caught.value.errors} == {
        "data.custom_cls.name": (
            "set it to the name of the class in "
            f"data.custom_cls.path='{class_files / 'missing.py'}'"
        ),
        "data.custom_cls.path": (
            f"{class_files / 'missing.py'} does not exist; point it at a Python file"
        ),
        "data.sampler.class_path": (
            "data.sampler.class_name='LastFirst' is set; set class_path to the Python file "
            "defining it, or drop class_name"
        ),
    }


def test_the_command_line_names_a_bad_class_in_one_line(tmp_path, capsys):
    (tmp_path / "plain.py").write_text("class Plain:\n    pass\n")
    status = main_ppo.main(
        [
            "--config-name",
            "grpo_tiny",
            *short_run(tmp_path),
            f"data.custom_cls.path={tmp_path / 'plain.py'}",
            "data.custom_cls.name=Plain",
        ]
    )
    assert status == main_ppo.USAGE_ERROR
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: data.custom_cls.name='Plain': Plain in {tmp_path / 'plain.py'} is not a "
        "subclass of torch.utils.data.dataset.Dataset; derive it from Dataset"
    )
