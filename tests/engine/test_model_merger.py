"""The model merger: trainer checkpoints (single-process, FSDP2 shards, critic, LoRA) to Hugging
Face folders whose logits equal the trained model's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from engine.config import load_config
from engine.model_merger import MergeError, compare_to_reference, merge_checkpoint
from engine.model_merger.__main__ import main
from engine.trainer import PPOTrainer, Recorder

PROMPTS = ["1+2=", "13+4=", "what is 5+60?"]
TINY = "tiny://model"


def tiny_run_config(folder: Path, preset: str, *overrides: str):
    """Return a one-step config that checkpoints after its step (a few seconds on a CPU)."""
    return load_config(
        f"{preset}.yaml",
        overrides=[
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "critic.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            # A large step, so the trained weights are far from the starting model's.
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.save_freq=1",
            "trainer.logger=[]",
            f"trainer.default_local_dir={folder}",
            *overrides,
        ],
    )


def prompt_inputs(folder: str | Path) -> dict[str, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    return dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))


@torch.no_grad()
def logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    return model(**inputs).logits.float()


def tiny_dir() -> Path:
    """Return the embedded tiny model's folder (the runs' starting point)."""
    from engine.roles.model_loading import resolve_path

    return Path(resolve_path(TINY))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """Return ``(trainer, step folder)`` of a one-step PPO run (policy and critic)."""
    folder = tmp_path_factory.mktemp("ppo") / "ckpt"
    trainer = PPOTrainer(tiny_run_config(folder, "ppo_tiny"))
    assert trainer.fit() == "succeeded"
    return trainer, folder / "global_step_1"


def test_a_single_process_policy_checkpoint_merges_to_the_trained_logits(ppo_run, tmp_path):
    trainer, step = ppo_run
    target = merge_checkpoint(step / "actor", tmp_path / "hf", hf_model_path=TINY)
    merged = AutoModelForCausalLM.from_pretrained(target)
    assert merged.dtype == torch.float32
    inputs = prompt_inputs(target)
    expected = logits(trainer.arr.model, inputs)
    assert max_diff(logits(merged, inputs), expected) < 1e-5
    base = AutoModelForCausalLM.from_pretrained(tiny_dir())
    assert max_diff(logits(base, inputs), expected) > 1e-3  # the step moved the weights
    # The tokenizer and its chat template come along.
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer.chat_template and tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+2="}], tokenize=False
    )
    assert (target / "generation_config.json").is_file()


def test_a_critic_checkpoint_merges_to_the_value_model(ppo_run, tmp_path):
    trainer, step = ppo_run
    target = merge_checkpoint(step / "critic", tmp_path / "critic", hf_model_path=TINY)
    critic = AutoModelForTokenClassification.from_pretrained(target)
    assert critic.config.num_labels == 1
    inputs = prompt_inputs(target)
    assert max_diff(logits(critic, inputs), logits(trainer.critic.model, inputs)) < 1e-5


def fake_shards(state: dict, world_size: int, fsdp_size: int | None = None) -> dict:
    """Return the single-process state as a Ray run lays out FSDP2 shards: ``torch.chunk``
    along dim 0 within each shard group of ``fsdp_size`` ranks, the tied head listed once."""
    fsdp_size = fsdp_size or world_size
    model = {k: v for k, v in state["model"].items() if not k.endswith("lm_head.weight")}
    ranks = []
    for rank in range(world_size):
        index = rank % fsdp_size
        shards = {}
        for name, tensor in model.items():
            chunks = torch.chunk(tensor, fsdp_size, dim=0)
            shards[name] = chunks[index].clone() if index < len(chunks) else tensor[:0].clone()
        ranks.append(
            {"model": shards, "lora": state.get("lora"), "rank": rank, "world_size": world_size}
        )
    return {"format": "fsdp2_sharded", "world_size": world_size, "ranks": ranks}


def write_state(folder: Path, state: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "state.pt")
    return folder


@pytest.mark.parametrize(("world_size", "fsdp_size"), [(2, None), (3, None), (4, 2)])
def test_shards_laid_out_as_fsdp2_saves_them_merge_to_the_same_weights(
    ppo_run, tmp_path, world_size, fsdp_size
):
    trainer, step = ppo_run
    state = torch.load(step / "actor" / "state.pt", weights_only=True)
    sharded = write_state(tmp_path / "actor", fake_shards(state, world_size, fsdp_size))
    target = merge_checkpoint(sharded, tmp_path / "hf", hf_model_path=TINY)
    merged = AutoModelForCausalLM.from_pretrained(target)
    inputs = prompt_inputs(target)
    assert max_diff(logits(merged, inputs), logits(trainer.arr.model, inputs)) < 1e-5


def test_a_missing_rank_shard_is_named(ppo_run, tmp_path):
    _, step = ppo_run
    state = fake_shards(torch.load(step / "actor" / "state.pt", weights_only=True), 2)
    state["ranks"] = state["ranks"][:1]
    folder = write_state(tmp_path / "actor", state)
    with pytest.raises(MergeError) as info:
        merge_checkpoint(folder, tmp_path / "hf", hf_model_path=TINY)
    message = str(info.value)
    assert str(folder / "state.pt") in message
    assert "shards of 2 ranks but holds ranks [0]: rank(s) [1] missing" in message
    assert "merge another global_step_<N>" in message


def test_shards_of_different_world_sizes_are_refused(ppo_run, tmp_path):
    _, step = ppo_run
    state = fake_shards(torch.load(step / "actor" / "state.pt", weights_only=True), 2)
    state["ranks"][1]["world_size"] = 4
    folder = write_state(tmp_path / "actor", state)
    with pytest.raises(MergeError, match=r"rank 1's shard was written by a group of 4 ranks"):
        merge_checkpoint(folder, tmp_path / "hf", hf_model_path=TINY)


def test_shards_that_do_not_fit_the_model_config_are_refused(ppo_run, tmp_path):
    _, step = ppo_run
    state = fake_shards(torch.load(step / "actor" / "state.pt", weights_only=True), 2)
    state["ranks"][1]["model"]["model.norm.weight"] = torch.ones(3)
    folder = write_state(tmp_path / "actor", state)
    with pytest.raises(MergeError, match=r"'model.norm.weight'.*do not add up to its shape"):
        merge_checkpoint(folder, tmp_path / "hf", hf_model_path=TINY)


def test_a_folder_that_is_not_a_checkpoint_gets_the_fix(ppo_run, tmp_path):
    _, step = ppo_run
    with pytest.raises(MergeError, match=r"no .*state.pt.*point --local_dir at .*/actor"):
        merge_checkpoint(step, tmp_path / "hf", hf_model_path=TINY)  # the step, not a role
    with pytest.raises(MergeError, match=r"global_step_<N>/actor \(or /critic\)"):
        merge_checkpoint(tmp_path, tmp_path / "hf", hf_model_path=TINY)
    with pytest.raises(MergeError, match=r"no huggingface/config.json.*pass --hf_model_path"):
        merge_checkpoint(step / "actor", tmp_path / "hf")
    with pytest.raises(MergeError, match=r"--hf_model_path .* is not a Hugging Face model"):
        merge_checkpoint(step / "actor", tmp_path / "hf", hf_model_path=str(tmp_path))


def test_a_checkpoint_saved_without_the_weights_is_named(tmp_path):
    write_state(tmp_path / "actor", {"optimizer": None, "contents": ["optimizer"]})
    with pytest.raises(MergeError, match=r"state.pt was saved without the weights"):
        merge_checkpoint(tmp_path / "actor", tmp_path / "hf", hf_model_path=TINY)


def test_a_state_file_with_a_pickled_object_is_refused(tmp_path):
    # Only weights_only loading: a file that would run code on unpickling is refused.
    write_state(tmp_path / "actor", {"model": {}, "extra": Path("x")})
    with pytest.raises(ValueError, match="holds objects other than tensors"):
        merge_checkpoint(tmp_path / "actor", tmp_path / "hf", hf_model_path=TINY)


def test_a_checkpoint_that_saved_hf_model_needs_no_hf_model_path(tmp_path):
    folder = tmp_path / "ckpt"
    config = tiny_run_config(
        folder,
        "grpo_tiny",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    )
    trainer = PPOTrainer(config)
    assert trainer.fit() == "succeeded"
    actor = folder / "global_step_1" / "actor"
    target = merge_checkpoint(actor, tmp_path / "hf")
    inputs = prompt_inputs(target)
    merged = AutoModelForCausalLM.from_pretrained(target)
    assert max_diff(logits(merged, inputs), logits(trainer.arr.model, inputs)) < 1e-5
    # verl's `test`: the checkpoint against the folder the trainer exported.
    result = compare_to_reference(actor, actor / "huggingface")
    assert result["max_abs_diff"] == 0.0 and result["tensors"] > 0
    other = tmp_path / "other"
    AutoModelForCausalLM.from_pretrained(tiny_dir()).save_pretrained(other)
    with pytest.raises(MergeError, match=r"differs from .* by up to"):
        compare_to_reference(actor, other)


MLP = ("gate_proj", "up_proj", "down_proj")
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", *MLP)  # a Qwen2 block's linear layers
# The first block keeps its base weights: actor_rollout_ref.model.exclude_modules as a regex.
EXCLUDE_FIRST_BLOCK = r".*\.layers\.0\..*"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """Return ``(trainer, actor folder)`` of a one-step GRPO run training a LoRA adapter
    (r=4, alpha=8) on every linear layer but those of the first block.

    8 samples a prompt: LoRA's B starts at zero, so a step whose groups all tie (every sample
    right, or every one wrong: no advantage) leaves the adapter at zero; with 2 samples that
    happens on some tiny-model builds; with 8 all four groups tie almost never.
    """
    pytest.importorskip("peft")
    folder = tmp_path_factory.mktemp("lora") / "ckpt"
    config = tiny_run_config(
        folder,
        "grpo_tiny",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        f"actor_rollout_ref.model.exclude_modules={EXCLUDE_FIRST_BLOCK}",
    )
    trainer = PPOTrainer(config)
    assert trainer.fit() == "succeeded"
    return trainer, folder / "global_step_1" / "actor"


def lora_layers(model: torch.nn.Module) -> set[str]:
    """Return the names of the modules that carry a LoRA adapter (without PEFT's prefix)."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    return {n.removeprefix(prefix) for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def test_a_lora_checkpoint_merges_the_adapter_into_a_plain_model(lora_run, tmp_path):
    trainer, actor = lora_run
    target = merge_checkpoint(actor, tmp_path / "hf", hf_model_path=TINY)
    merged = AutoModelForCausalLM.from_pretrained(target)
    assert not any("lora" in k for k in merged.state_dict())  # a plain model
    inputs = prompt_inputs(target)
    expected = logits(trainer.arr.model, inputs)  # the PEFT policy, adapter active
    assert max_diff(logits(merged, inputs), expected) < 1e-5
    base = AutoModelForCausalLM.from_pretrained(tiny_dir())
    assert max_diff(logits(base, inputs), expected) > 1e-4  # the adapter changed the policy
    # The excluded block keeps the base weights; an adapted one does not.
    plain, start = merged.state_dict(), base.state_dict()
    assert torch.equal(
        plain["model.layers.0.mlp.up_proj.weight"], start["model.layers.0.mlp.up_proj.weight"]
    )
    assert not torch.equal(
        plain["model.layers.1.mlp.up_proj.weight"], start["model.layers.1.mlp.up_proj.weight"]
    )
    # The same adapter in two ranks' shards (lora_A split along r, lora_B along the output).
    state = torch.load(actor / "state.pt", weights_only=True)
    sharded = write_state(tmp_path / "sharded" / "actor", fake_shards(state, 2))
    target = merge_checkpoint(sharded, tmp_path / "hf_sharded", hf_model_path=TINY)
    merged = AutoModelForCausalLM.from_pretrained(target)
    assert max_diff(logits(merged, inputs), expected) < 1e-5


def test_the_saved_adapter_loads_with_peft_as_it_trained(lora_run, tmp_path):
    peft = pytest.importorskip("peft")
    trainer, actor = lora_run
    argv = ["merge", "--backend", "fsdp", "--local_dir", str(actor), "--hf_model_path", TINY]
    assert main([*argv, "--target_dir", str(tmp_path / "hf"), "--save-lora-adapter"]) == 0
    folder = tmp_path / "hf" / "lora_adapter"
    adapter = json.loads((folder / "adapter_config.json").read_text())
    trained = lora_layers(trainer.arr.model)
    assert trained and not any(".layers.0." in n for n in trained)
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    # PEFT records "all-linear" as the layer names it selected.
    assert sorted(adapter["target_modules"]) == sorted(LINEAR)
    assert (adapter["lora_dropout"], adapter["bias"], adapter["task_type"]) == (
        0.0,
        "none",
        "CAUSAL_LM",
    )
    assert adapter["use_rslora"] is False
    assert adapter["exclude_modules"] == EXCLUDE_FIRST_BLOCK  # as the run was given it
    base = AutoModelForCausalLM.from_pretrained(tiny_dir())
    with_adapter = peft.PeftModel.from_pretrained(base, folder)
    assert lora_layers(with_adapter) == trained  # no zero adapters on the excluded block
    inputs = prompt_inputs(tmp_path / "hf")
    expected = logits(trainer.arr.model, inputs)
    assert max_diff(logits(with_adapter, inputs), expected) < 1e-5


def test_a_checkpoint_without_recorded_exclude_modules_names_the_left_out_modules(
    lora_run, tmp_path
):
    peft = pytest.importorskip("peft")
    trainer, actor = lora_run
    state = torch.load(actor / "state.pt", weights_only=True)
    assert state["lora"].pop("exclude_modules") == EXCLUDE_FIRST_BLOCK  # the trainer records it
    unrecorded = write_state(tmp_path / "unrecorded" / "actor", state)
    target = merge_checkpoint(
        unrecorded, tmp_path / "hf", hf_model_path=TINY, save_lora_adapter=True
    )
    adapter = json.loads((target / "lora_adapter" / "adapter_config.json").read_text())
    # Read off the weights: the target modules that hold no adapter tensors, one by one.
    assert sorted(adapter["exclude_modules"]) == sorted(
        f"model.layers.0.{'mlp' if name in MLP else 'self_attn'}.{name}" for name in LINEAR
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_dir())
    with_adapter = peft.PeftModel.from_pretrained(base, target / "lora_adapter")
    assert lora_layers(with_adapter) == lora_layers(trainer.arr.model)
    inputs = prompt_inputs(target)
    assert max_diff(logits(with_adapter, inputs), logits(trainer.arr.model, inputs)) < 1e-5
    # Settings that would adapt other modules than the checkpoint trained are refused before
    # anything is written.
    state["lora"]["exclude_modules"] = r".*\.layers\.1\..*"
    wrong = write_state(tmp_path / "wrong" / "actor", state)
    with pytest.raises(MergeError) as info:
        merge_checkpoint(wrong, tmp_path / "hf_wrong", hf_model_path=TINY, save_lora_adapter=True)
    message = str(info.value)
    assert "trained, not selected: ['model.layers.1.mlp.down_proj'" in message
    assert "selected, not trained: ['model.layers.0.mlp.down_proj'" in message
    assert "merge without --save-lora-adapter" in message
    assert not (tmp_path / "hf_wrong").exists()


def test_save_lora_adapter_without_an_adapter_is_refused(ppo_run, tmp_path):
    _, step = ppo_run
    with pytest.raises(MergeError, match="holds no LoRA adapter"):
        merge_checkpoint(
            step / "actor", tmp_path / "hf", hf_model_path=TINY, save_lora_adapter=True
        )


def test_the_command_line_merges_and_refuses_what_it_cannot_do(ppo_run, tmp_path, capsys):
    trainer, step = ppo_run
    common = ["--backend", "fsdp", "--local_dir", str(step / "actor"), "--hf_model_path", TINY]
    assert main(["merge", *common, "--target_dir", str(tmp_path / "hf")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    inputs = prompt_inputs(tmp_path / "hf")
    assert max_diff(logits(merged, inputs), logits(trainer.arr.model, inputs)) < 1e-5
    assert main(["test", *common, "--test_hf_dir", str(tmp_path / "hf")]) == 0
    assert "matches" in capsys.readouterr().out

    refused = {
        "--backend megatron": ["merge", *common, "--backend", "megatron"],
        "--hf_upload_path": ["merge", *common, "--hf_upload_path", "me/model"],
        "--is-value-model": ["merge", *common, "--is-value-model"],
    }
    for flag, argv in refused.items():
        assert main(argv) == 2, flag
        assert flag in capsys.readouterr().err, flag


@pytest.mark.slow
def test_the_python_m_entry_point_runs(ppo_run, tmp_path):
    _, step = ppo_run
    cmd = [sys.executable, "-m", "engine.model_merger", "merge", "--backend", "fsdp"]
    cmd += ["--local_dir", str(step / "critic"), "--target_dir", str(tmp_path / "critic")]
    cmd += ["--hf_model_path", TINY, "--is-value-model"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "critic" / "config.json").is_file()


class GatherAtCheckpoint(Recorder):
    """Keep the policy's gathered weights when the checkpoint is written (before shutdown)."""

    trainer = None
    full: dict[str, torch.Tensor] | None = None

    def on_checkpoint(self, step, path):
        self.full = self.trainer.arr.full_state_dict()


@pytest.mark.slow
def test_a_two_rank_fsdp2_checkpoint_of_a_ray_run_merges_to_the_trained_weights(tmp_path):
    ray = pytest.importorskip("ray")
    from engine.trainer.ray_trainer import RayPPOTrainer

    folder = tmp_path / "ckpt"
    config = tiny_run_config(
        folder, "ppo_tiny", "trainer.controller=ray", "trainer.n_gpus_per_node=2"
    )
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        recorder = GatherAtCheckpoint()
        trainer = RayPPOTrainer(config, recorder, cpus_per_rank=0.5)
        recorder.trainer = trainer
        assert trainer.fit() == "succeeded"
    finally:
        ray.shutdown()
    step = folder / "global_step_1"
    shards = torch.load(step / "actor" / "state.pt", weights_only=True)
    assert shards["format"] == "fsdp2_sharded" and len(shards["ranks"]) == 2
    target = merge_checkpoint(step / "actor", tmp_path / "hf", hf_model_path=TINY)
    merged = AutoModelForCausalLM.from_pretrained(target)
    expected = recorder.full
    assert expected is not None
    state = merged.state_dict()
    assert max(max_diff(state[k], v) for k, v in expected.items()) == 0.0
    reference = AutoModelForCausalLM.from_pretrained(tiny_dir())
    reference.load_state_dict(expected, strict=False)
    inputs = prompt_inputs(target)
    assert max_diff(logits(merged, inputs), logits(reference, inputs)) < 1e-5
    critic = merge_checkpoint(step / "critic", tmp_path / "critic", hf_model_path=TINY)
    value_model = AutoModelForTokenClassification.from_pretrained(critic)
    assert value_model.config.num_labels == 1
    assert logits(value_model, inputs).shape[-1] == 1
