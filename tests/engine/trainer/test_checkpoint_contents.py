"""``checkpoint.save_contents`` / ``load_contents`` for the actor and the critic."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForTokenClassification

from engine.trainer import PPOTrainer
from engine.trainer.checkpoint import (
    load_state,
    merge_contents,
    saved_contents,
    select_contents,
    step_dir,
)

ACTOR = "actor_rollout_ref.actor.checkpoint"


def worker_state(tag: str) -> dict:
    return {
        "model": f"{tag}-w",
        "lora": None,
        "optimizer": f"{tag}-o",
        "lr_scheduler": f"{tag}-s",
        "generator": f"{tag}-g",
    }


def test_select_contents_keeps_only_the_listed_parts():
    assert select_contents(worker_state("a"), ["model"]) == {
        "model": "a-w",
        "lora": None,
        "contents": ["model"],
    }
    assert select_contents(worker_state("a"), ["optimizer", "hf_model"]) == {
        "optimizer": "a-o",
        "contents": ["optimizer"],
    }
    sharded = {"format": "fsdp2_sharded", "world_size": 2, "ranks": []}
    sharded["ranks"] = [{**worker_state(f"r{i}"), "rank": i} for i in range(2)]
    kept = select_contents(sharded, ["extra"])
    assert kept["ranks"] == [
        {"lr_scheduler": f"r{i}-s", "generator": f"r{i}-g", "rank": i} for i in range(2)
    ]
    assert kept["contents"] == ["extra"] and kept["world_size"] == 2


def test_merge_contents_takes_the_listed_parts_and_keeps_the_rest_live():
    saved = select_contents(worker_state("saved"), ["model", "optimizer", "extra"])
    merged = merge_contents(worker_state("live"), saved, ["model", "extra"])
    assert merged == {**worker_state("saved"), "optimizer": "live-o"}
    sharded = {"format": "fsdp2_sharded", "world_size": 1, "ranks": [worker_state("saved")]}
    live = {"format": "fsdp2_sharded", "world_size": 1, "ranks": [worker_state("live")]}
    merged = merge_contents(live, sharded, ["optimizer"])
    assert merged["ranks"] == [{**worker_state("live"), "optimizer": "saved-o"}]


def test_saved_contents_reads_the_list_and_the_hf_folder(tmp_path):
    assert saved_contents(tmp_path, {"contents": ["model"]}) == ["model"]
    assert saved_contents(tmp_path, {}) == ["model", "optimizer", "extra"]  # older checkpoints
    (tmp_path / "huggingface").mkdir()
    assert saved_contents(tmp_path, {"contents": []}) == ["hf_model"]


def train_one_step(make_config, preset: str, *overrides: str) -> PPOTrainer:
    trainer = PPOTrainer(
        make_config(preset, "trainer.total_training_steps=1", "trainer.save_freq=1", *overrides)
    )
    assert trainer.fit() == "succeeded"
    return trainer


def resumed(make_config, preset: str, *overrides: str) -> PPOTrainer:
    trainer = PPOTrainer(make_config(preset, "trainer.total_training_steps=2", *overrides))
    trainer.load_checkpoint()
    assert trainer.global_step == 1
    return trainer


def test_a_model_only_checkpoint_has_no_optimizer_and_resumes_with_a_fresh_one(
    make_config, tmp_path
):
    first = train_one_step(make_config, "grpo_tiny", f"{ACTOR}.save_contents=[model]")
    state = load_state(step_dir(tmp_path / "ckpt", 1) / "actor" / "state.pt")
    assert state["contents"] == ["model"]
    assert {"optimizer", "lr_scheduler", "generator"}.isdisjoint(state)
    with pytest.warns(UserWarning, match=r"without \['optimizer', 'extra'\].*optimizer starts"):
        second = resumed(make_config, "grpo_tiny", f"{ACTOR}.save_contents=[model]")
    trained = first.arr.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in second.arr.model.state_dict().items())
    assert not second.arr.actor.optimizer.state_dict()["state"]


def test_load_contents_without_the_optimizer_starts_a_fresh_one(make_config):
    train_one_step(make_config, "grpo_tiny")
    assert resumed(make_config, "grpo_tiny").arr.actor.optimizer.state_dict()["state"]
    with pytest.warns(UserWarning, match="optimizer starts fresh"):
        fresh = resumed(make_config, "grpo_tiny", f"{ACTOR}.load_contents=[model,extra]")
    assert not fresh.arr.actor.optimizer.state_dict()["state"]


def test_loading_what_the_checkpoint_lacks_is_refused(make_config):
    train_one_step(make_config, "grpo_tiny", f"{ACTOR}.save_contents=[model]")
    for load in ("[model,optimizer]", "[model,hf_model]"):
        with pytest.raises(ValueError, match=rf"{ACTOR}.load_contents asks for .* holds only"):
            resumed(make_config, "grpo_tiny", f"{ACTOR}.load_contents={load}")


def test_critic_contents_and_its_hugging_face_folder(make_config, tmp_path):
    trainer = train_one_step(
        make_config,
        "ppo_tiny",
        "critic.checkpoint.save_contents=[model,hf_model]",
        "data.train_batch_size=4",
        "critic.ppo_mini_batch_size=4",
    )
    folder = step_dir(tmp_path / "ckpt", 1)
    critic_state = load_state(folder / "critic" / "state.pt")
    assert critic_state["contents"] == ["model"] and "optimizer" not in critic_state
    assert "optimizer" in load_state(folder / "actor" / "state.pt")  # the actor's default
    value_model = AutoModelForTokenClassification.from_pretrained(folder / "critic" / "huggingface")
    live = trainer.critic.model.state_dict()
    assert all(torch.equal(v, live[k]) for k, v in value_model.state_dict().items())


def test_a_sharded_critic_asked_for_a_hugging_face_folder_is_refused(make_config):
    config = make_config(
        "ppo_tiny", "trainer.controller=ray", "critic.checkpoint.save_contents=[model,hf_model]"
    )
    with pytest.raises(ValueError, match="sharded critic .* drop hf_model"):
        PPOTrainer(config)
