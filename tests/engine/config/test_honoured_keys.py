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
from engine.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.roles.model_loading import load_critic, load_policy
from engine.tiny.tokenizer import build_tokenizer
from engine.trainer.ppo_trainer import PPOTrainer
from tests.engine.data.helpers import build_char_tokenizer, verl_row, write_jsonl
from tests.engine.distributed.helpers import tiny_policy
from tests.engine.roles.test_epochs_and_schedules import lrs

CPU = torch.device("cpu")
# The tiny chat template, plus a marker before the assistant turn when enable_thinking is set.
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{% if enable_thinking %}~{% endif %}<|assistant|>{% endif %}"
)


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


# -- optim.lr_warmup_steps / lr_warmup_steps_ratio (actor and critic) ---------------------------
def first_lrs(optim) -> list[float]:
    return lrs(optim, total=10, steps=6)


@pytest.mark.parametrize("role", ["actor_rollout_ref.actor", "critic"])
def test_lr_warmup_steps_and_lr_warmup_steps_ratio_set_the_warm_up(role):
    steps = resolve_config(load_config("ppo_tiny", [f"{role}.optim.lr_warmup_steps=4"]))
    ratio = resolve_config(load_config("ppo_tiny", [f"{role}.optim.lr_warmup_steps_ratio=0.2"]))
    section = (lambda c: c.critic) if role == "critic" else (lambda c: c.actor_rollout_ref.actor)
    assert first_lrs(section(steps).optim) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert first_lrs(section(ratio).optim) == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]  # 0.2 x 10 steps
    # lr_warmup_steps wins over the ratio when both are set, as in verl.
    both = resolve_config(
        load_config(
            "ppo_tiny",
            [f"{role}.optim.lr_warmup_steps=4", f"{role}.optim.lr_warmup_steps_ratio=0.2"],
        )
    )
    assert first_lrs(section(both).optim)[:3] == [0.0, 0.25, 0.5]


# -- data.val_batch_size -------------------------------------------------------------------------
def test_val_batch_size_splits_validation_into_batches(tiny_config, monkeypatch):
    trainer = PPOTrainer(tiny_config("grpo_tiny", "data.val_max_samples=6"))
    sizes: list[int] = []
    generate = trainer.arr.generate_sequences

    def counting(prompts, *args, **kwargs):
        sizes.append(len(prompts))
        return generate(prompts, *args, **kwargs)

    monkeypatch.setattr(trainer.arr, "generate_sequences", counting)
    trainer.validate()
    assert sizes == [6]  # null: the whole set at once
    sizes.clear()
    trainer.config.data.val_batch_size = 4
    trainer.validate()
    assert sizes == [4, 2]


# -- ref / rollout log_prob_use_dynamic_bsz --------------------------------------------------------
@pytest.mark.parametrize("flag", [True, False])
def test_log_prob_use_dynamic_bsz_gives_the_log_prob_passes_a_token_budget(tiny_config, flag):
    config = tiny_config(
        "grpo_tiny",
        f"actor_rollout_ref.ref.log_prob_use_dynamic_bsz={flag}",
        f"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz={flag}",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=96",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64",
    )
    worker = ActorRolloutRefWorker(resolve_config(config), device=CPU, total_steps=1, need_ref=True)
    expected = (64, 96) if flag else (None, None)
    assert (worker.log_prob_max_token_len, worker.ref_max_token_len) == expected


# -- model / critic.model trust_remote_code --------------------------------------------------------
CUSTOM_CODE = """
from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification


class RemotePolicy(Qwen2ForCausalLM):
    pass


class RemoteCritic(Qwen2ForTokenClassification):
    pass
"""


@pytest.fixture
def remote_code_model(tiny_assets, tmp_path):
    """Return a copy of the tiny model whose config.json maps the Auto classes to its own code."""
    import json
    import shutil

    from engine.roles.model_loading import resolve_path

    folder = tmp_path / "remote_model"
    shutil.copytree(resolve_path("tiny://model"), folder)
    (folder / "remote_code.py").write_text(CUSTOM_CODE)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {
        "AutoModelForCausalLM": "remote_code.RemotePolicy",
        "AutoModelForTokenClassification": "remote_code.RemoteCritic",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_model_trust_remote_code_loads_the_models_own_code(remote_code_model):
    model = PPOConfig().actor_rollout_ref.model
    model.path = remote_code_model
    assert type(load_policy(model, CPU)).__name__ == "Qwen2ForCausalLM"  # its code is not run
    model.trust_remote_code = True
    assert type(load_policy(model, CPU)).__name__ == "RemotePolicy"


def test_critic_model_trust_remote_code_loads_the_models_own_code(remote_code_model):
    config = PPOConfig()
    config.actor_rollout_ref.model.path = remote_code_model
    critic = load_critic(config.critic, config.actor_rollout_ref.model, CPU)
    assert type(critic).__name__ == "Qwen2ForTokenClassification"
    config.critic.model.trust_remote_code = True
    assert type(load_critic(config.critic, config.actor_rollout_ref.model, CPU)).__name__ == (
        "RemoteCritic"
    )
