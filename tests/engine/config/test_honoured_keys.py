"""Keys declared honoured that change what the engine does, each checked where it is read.

Every test names its key and fails if the engine ignored it: data.train_max_samples,
data.val_max_samples, data.apply_chat_template_kwargs, actor_rollout_ref.model.exclude_modules,
trainer.max_critic_ckpt_to_keep, actor_rollout_ref.model.external_lib, critic.model.external_lib
and the legacy global actor_rollout_ref.actor.ppo_micro_batch_size.
"""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.config import PPOConfig, load_config, resolve_config
from engine.data.dataset import RLHFDataset
from engine.tiny.tokenizer import build_tokenizer
from engine.trainer.ppo_trainer import PPOTrainer
from engine.workers.actor_rollout_ref import ActorRolloutRefWorker
from engine.workers.models import load_critic, load_policy
from tests.engine.data.helpers import build_char_tokenizer, verl_row, write_jsonl
from tests.engine.distributed.helpers import tiny_policy

CPU = torch.device("cpu")
# The tiny chat template, plus a marker before the assistant turn when enable_thinking is set.
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{% if enable_thinking %}~{% endif %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_assets():
    from engine.tiny import ensure_tiny_assets

    return ensure_tiny_assets()


@pytest.fixture
def tiny_config(tiny_assets, tmp_path):
    """Return a function building a short tiny-model config with extra overrides."""

    def build(preset: str = "grpo_tiny", *overrides: str) -> PPOConfig:
        base = [
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.save_freq=-1",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ]
        return load_config(f"{preset}.yaml", overrides=base + list(overrides))

    return build


def questions(dataset: RLHFDataset) -> list[str]:
    return [row["raw_prompt"][0]["content"] for row in dataset.rows]


# -- data.train_max_samples / data.val_max_samples ---------------------------------------------
def arithmetic_file(tmp_path, rows: int):
    return write_jsonl(
        tmp_path / "arith.jsonl", [verl_row(f"{i}+1=", str(i + 1)) for i in range(rows)]
    )


def test_train_max_samples_keeps_the_first_rows_without_shuffle(tmp_path):
    path = arithmetic_file(tmp_path, 10)
    data = PPOConfig().data
    data.shuffle, data.train_max_samples = False, 4
    dataset = RLHFDataset(path, build_char_tokenizer(), data, max_samples=data.train_max_samples)
    assert questions(dataset) == ["0+1=", "1+1=", "2+1=", "3+1="]
    assert [dataset[i]["index"] for i in range(4)] == [0, 1, 2, 3]
    # More than the file holds, -1 and 0 keep every row (as verl).
    for everything in (11, -1, 0):
        assert len(RLHFDataset(path, build_char_tokenizer(), data, max_samples=everything)) == 10


def test_train_max_samples_with_shuffle_draws_verls_seeded_rows(tmp_path):
    path = arithmetic_file(tmp_path, 10)
    data = PPOConfig().data
    data.shuffle, data.seed = True, 7
    dataset = RLHFDataset(path, build_char_tokenizer(), data, max_samples=3)
    # verl's RLHFDataset: np.random.default_rng(seed).choice(total, size, replace=False).
    expected = np.random.default_rng(7).choice(10, size=3, replace=False).tolist()
    assert [dataset[i]["index"] for i in range(3)] == expected
    assert questions(dataset) == [f"{i}+1=" for i in expected]


def test_the_trainer_reads_train_max_samples_and_val_max_samples(tiny_config):
    full = PPOTrainer(tiny_config("grpo_tiny", "data.shuffle=False"))
    trainer = PPOTrainer(
        tiny_config(
            "grpo_tiny",
            "data.shuffle=False",
            "data.train_max_samples=8",
            "data.val_max_samples=3",
        )
    )
    assert len(full.train_dataset) == 2000 and len(full.val_dataset) == 200
    assert len(trainer.train_dataset) == 8 and len(trainer.train_loader) == 2  # batches of 4
    assert questions(trainer.train_dataset) == questions(full.train_dataset)[:8]
    assert questions(trainer.val_dataset) == questions(full.val_dataset)[:3]


# -- data.apply_chat_template_kwargs -----------------------------------------------------------
def test_apply_chat_template_kwargs_reach_the_prompt_template(tmp_path):
    path = arithmetic_file(tmp_path, 1)
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = THINKING_TEMPLATE
    data = PPOConfig().data
    plain = RLHFDataset(path, tokenizer, data)
    data.apply_chat_template_kwargs = {"enable_thinking": True}
    thinking = RLHFDataset(path, tokenizer, data)
    assert plain[0]["prompt_text"] == "<bos><|user|>0+1=<|assistant|>"
    assert thinking[0]["prompt_text"] == "<bos><|user|>0+1=~<|assistant|>"
    assert len(thinking[0]["input_ids"]) == len(plain[0]["input_ids"]) + 1


def test_apply_chat_template_kwargs_reach_the_multi_turn_rollout(tmp_path):
    interaction = tmp_path / "interaction.py"
    interaction.write_text("def reply(messages, extra_info):\n    return None\n")
    config = PPOConfig()
    tokenizer = build_tokenizer()
    arr = config.actor_rollout_ref
    arr.model.tokenizer, arr.model.hf_model = tokenizer, tiny_policy(len(tokenizer))
    arr.actor.ppo_mini_batch_size = config.data.train_batch_size = 4
    arr.rollout.multi_turn.enable = True
    arr.rollout.multi_turn.interaction_path = str(interaction)
    arr.rollout.multi_turn.interaction_name = "reply"
    config.data.apply_chat_template_kwargs = {"enable_thinking": True}
    worker = ActorRolloutRefWorker(config, device=CPU, total_steps=1, need_ref=False)
    assert worker.rollout.chat_template_kwargs == {"enable_thinking": True}


# -- actor_rollout_ref.model.exclude_modules ---------------------------------------------------
def lora_layers(model: torch.nn.Module) -> set[str]:
    return {
        name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")
    }


def lora_model_config(**values) -> SimpleNamespace:
    model = PPOConfig().actor_rollout_ref.model
    model.lora_rank, model.enable_gradient_checkpointing = 4, False
    for key, value in values.items():
        setattr(model, key, value)
    model.hf_model = tiny_policy(103)
    return model


def test_exclude_modules_leaves_the_named_layers_without_lora():
    pytest.importorskip("peft")
    every = lora_layers(load_policy(lora_model_config(), CPU))
    assert {"q_proj", "v_proj", "down_proj"} <= every
    listed = lora_layers(load_policy(lora_model_config(exclude_modules=["q_proj", "v_proj"]), CPU))
    assert listed == every - {"q_proj", "v_proj"}
    # A string is a regular expression over the whole module name, as PEFT (and verl) read it.
    regex = lora_layers(load_policy(lora_model_config(exclude_modules=r".*mlp\..*"), CPU))
    assert regex == every - {"gate_proj", "up_proj", "down_proj"}


def test_exclude_modules_with_a_peft_too_old_names_the_version_needed(monkeypatch):
    peft = pytest.importorskip("peft")

    class OldLoraConfig:  # peft before 0.14: a LoraConfig without exclude_modules
        __dataclass_fields__ = {"r": None, "target_modules": None}

    monkeypatch.setattr(peft, "LoraConfig", OldLoraConfig)
    monkeypatch.setattr(peft, "__version__", "0.13.2")
    with pytest.raises(ImportError, match=r"exclude_modules needs peft>=0.14 \(installed: 0.13.2"):
        load_policy(lora_model_config(exclude_modules=["q_proj"]), CPU)


# -- actor_rollout_ref.model.external_lib / critic.model.external_lib -------------------------
@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """Return a module name whose import writes ``imported.txt`` beside it."""
    name = "posttrain_external_lib_probe"
    (tmp_path / f"{name}.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('imported.txt').write_text(__name__)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name, tmp_path / "imported.txt"
    sys.modules.pop(name, None)


def test_actor_model_external_lib_is_imported_before_the_policy_loads(tiny_assets, probe_module):
    name, marker = probe_module
    model = PPOConfig().actor_rollout_ref.model
    model.path, model.external_lib = "tiny://model", name
    load_policy(model, CPU)
    assert marker.read_text() == name


def test_critic_model_external_lib_is_imported_before_the_critic_loads(tiny_assets, probe_module):
    name, marker = probe_module
    config = PPOConfig()
    config.actor_rollout_ref.model.path = "tiny://model"
    config.critic.model.external_lib = name
    load_critic(config.critic, config.actor_rollout_ref.model, CPU)
    assert marker.read_text() == name


def test_an_external_lib_that_fails_to_import_names_the_key(tiny_assets, tmp_path, monkeypatch):
    (tmp_path / "posttrain_broken_lib.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = PPOConfig()
    model = config.actor_rollout_ref.model
    model.path, model.external_lib = "tiny://model", "posttrain_no_such_module"
    with pytest.raises(
        ImportError, match=r"actor_rollout_ref\.model\.external_lib=.*ModuleNotFound"
    ):
        load_policy(model, CPU)
    config.critic.model.external_lib = "posttrain_broken_lib"
    with pytest.raises(ImportError, match=r"critic\.model\.external_lib=.*RuntimeError: boom"):
        load_critic(config.critic, model, CPU)


# -- trainer.max_critic_ckpt_to_keep (with max_actor_ckpt_to_keep) ----------------------------
def test_max_critic_ckpt_to_keep_prunes_critic_state_and_resume_uses_the_newest(tiny_config):
    keep = ("trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=1")
    common = ("trainer.save_freq=1", "actor_rollout_ref.rollout.n=1", *keep)
    first = PPOTrainer(tiny_config("ppo_tiny", "trainer.total_training_steps=3", *common))
    assert first.fit() == "succeeded"
    folder = first.local_dir
    held = {
        path.name: sorted(p.name for p in path.iterdir() if p.is_dir())
        for path in folder.glob("global_step_*")
    }
    assert held == {"global_step_2": ["actor"], "global_step_3": ["actor", "critic"]}

    second = PPOTrainer(tiny_config("ppo_tiny", "trainer.total_training_steps=4", *common))
    assert second.fit() == "succeeded"
    assert second.global_step == 4
    assert sorted(p.name for p in folder.glob("global_step_*")) == [
        "global_step_3",
        "global_step_4",
    ]
    assert not (folder / "global_step_3" / "critic").exists()

    older = PPOTrainer(
        tiny_config(
            "ppo_tiny",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={folder / 'global_step_3'}",
            *common,
        )
    )
    with pytest.raises(FileNotFoundError, match="max_critic_ckpt_to_keep pruned it"):
        older.load_checkpoint()


# -- the legacy global actor_rollout_ref.actor.ppo_micro_batch_size ---------------------------
def test_legacy_ppo_micro_batch_size_reaches_the_trainers_actor_worker(tiny_config):
    # grpo_tiny: a mini-batch of 4 prompts x 8 samples; micro-batches are the whole 32 unless set.
    default = PPOTrainer(tiny_config("grpo_tiny"))
    legacy = PPOTrainer(tiny_config("grpo_tiny", "actor_rollout_ref.actor.ppo_micro_batch_size=4"))
    assert default.arr.micro_batch_size == 32
    assert legacy.config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4
    assert legacy.arr.micro_batch_size == 4


def test_legacy_ppo_micro_batch_size_is_split_over_two_data_parallel_ranks(tiny_config):
    config = tiny_config(
        "grpo_tiny", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size=8"
    )
    resolve_config(config)
    for rank in (0, 1):
        worker = ActorRolloutRefWorker(
            copy.deepcopy(config),
            device=CPU,
            total_steps=1,
            need_ref=False,
            rank=rank,
            world_size=2,
        )
        assert worker.mini_batch_size == 16  # 4 prompts x 8 samples over 2 ranks
        assert worker.micro_batch_size == 4
