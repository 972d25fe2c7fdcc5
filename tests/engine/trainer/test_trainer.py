"""The single-process trainer on the embedded tiny model (CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.roles.actor import response_logits
from engine.trainer import PPOTrainer, Recorder
from engine.trainer.run import run_training
from tests.engine.command_line import metric_rows, train_from_command_line

VERL_METRICS = [
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/lr",
    "response_length/mean",
    "response_length/clip_ratio",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
]


class ListRecorder(Recorder):
    """Keep everything the trainer reports; ask to stop after ``stop_after`` steps."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: list[tuple[int, dict]] = []
        self.samples: list = []
        self.checkpoints: list[tuple[int, str]] = []
        self.finished: list[str] = []
        self.stop_after = stop_after

    def on_step(self, step, metrics):
        self.steps.append((step, metrics))

    def on_samples(self, step, samples):
        self.samples.extend(samples)

    def on_checkpoint(self, step, path):
        self.checkpoints.append((step, path))

    def on_finish(self, *, status, error=None):
        self.finished.append(status)

    def should_stop(self):
        return self.stop_after is not None and len(self.steps) + 1 >= self.stop_after


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_grpo_step_updates_the_policy_and_reports_verl_metrics(make_config):
    trainer = PPOTrainer(make_config("grpo_tiny", "trainer.total_training_steps=1"))
    before = parameters(trainer.arr.model)
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    after = parameters(trainer.arr.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    ((step, metrics),) = recorder.steps
    assert step == 1
    missing = [k for k in VERL_METRICS if k not in metrics]
    assert not missing, missing
    assert 0.0 <= metrics["critic/score/mean"] <= 1.0
    # GRPO advantages are normalised within each group: each group's sequence advantages sum
    # to ~0 (the token-level mean need not, since responses differ in length).
    groups: dict[str, list[float]] = {}
    for record in recorder.samples:
        groups.setdefault(record.group_id, []).append(record.advantage)
    for advantages in groups.values():
        assert abs(sum(advantages)) < 1e-4
    n = trainer.config.actor_rollout_ref.rollout.n
    assert len(recorder.samples) == trainer.config.data.train_batch_size * n
    sample = recorder.samples[0]
    assert sample.split == "train" and sample.response_length == len(sample.token_logprobs)
    assert len(sample.tokens) == sample.response_length
    assert sample.token_ref_logprobs is not None  # use_kl_loss needs the reference
    group = [s for s in recorder.samples if s.group_id == sample.group_id]
    assert sorted(s.sample_index for s in group) == list(range(n))
    assert len({s.prompt_text for s in group}) == 1


def test_rollout_ignore_eos_samples_every_response_to_the_limit(make_config):
    config = make_config(
        "grpo_tiny", "trainer.total_training_steps=1", "actor_rollout_ref.rollout.ignore_eos=True"
    )
    trainer = PPOTrainer(config)
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    ((_, metrics),) = recorder.steps
    limit = config.data.max_response_length
    assert metrics["response_length/mean"] == limit
    assert metrics["response_length/clip_ratio"] == 1.0
    assert {s.response_length for s in recorder.samples} == {limit}


def test_rollout_response_length_caps_the_responses_as_in_verl(make_config):
    # verl's rollout.response_length is the engine's max_tokens (data.max_response_length by
    # default); ignore_eos makes every response reach whichever cap applies.
    config = make_config(
        "grpo_tiny",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.response_length=3",
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    assert config.data.max_response_length > 3
    assert {s.response_length for s in recorder.samples} == {3}


def test_recomputed_old_log_probs_give_ratio_one(make_config):
    config = make_config("grpo_tiny", "actor_rollout_ref.actor.ppo_epochs=2")
    trainer = PPOTrainer(config)
    prompts = next(iter(trainer.train_loader))
    batch = prompts.repeat(config.actor_rollout_ref.rollout.n)
    gen = trainer.arr.generate_sequences(batch)
    batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    batch = batch.union(gen)
    assert trainer.arr.needs_old_log_prob(len(batch))
    old = trainer.arr.compute_log_prob(batch).batch["old_log_probs"]
    trainer.arr.model.train()
    with torch.no_grad():
        logits = response_logits(trainer.arr.model, batch.batch)
        current = torch.log_softmax(logits, -1).gather(-1, batch.batch["responses"][..., None])
    mask = batch.batch["response_mask"].bool()
    ratio = torch.exp(current.squeeze(-1) - old)[mask]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    # The rollout's own log-probs are the same numbers (the on-policy shortcut relies on it).
    torch.testing.assert_close(gen.batch["rollout_log_probs"][mask], old[mask], atol=1e-4, rtol=0)


def end_every_other_response_early(gen, pad_token_id: int) -> None:
    """Cut every other response of ``gen`` to half its length, as a sampled end-of-sequence would.

    The rollout's tensors are rewritten the way it writes a response that ended there: pad tokens
    after it, out of the response mask and the attention mask, and position ids to match.
    """
    tensors = gen.batch
    responses = tensors["responses"]  # (bs, T)
    bs, length = responses.shape
    rows = torch.arange(bs) % 2 == 0  # (bs,)
    tail = torch.arange(length) >= length // 2  # (T,)
    ended = rows[:, None] & tail[None, :]  # (bs, T)
    prompt_mask = tensors["attention_mask"][:, : tensors["prompts"].shape[-1]]
    tensors["responses"] = responses.masked_fill(ended, pad_token_id)
    tensors["response_mask"] = tensors["response_mask"].masked_fill(ended, 0)
    tensors["rollout_log_probs"] = tensors["rollout_log_probs"].masked_fill(ended, 0.0)
    tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=-1)
    tensors["attention_mask"] = torch.cat([prompt_mask, tensors["response_mask"]], dim=-1)
    tensors["position_ids"] = (tensors["attention_mask"].cumsum(-1) - 1).clamp(min=0)


def test_masked_response_tokens_never_change_the_loss(make_config):
    # Every row samples to the full length; then half of them are cut short, so the batch has
    # masked tokens whatever the model samples, and responses of two lengths.
    trainer = PPOTrainer(make_config("grpo_tiny", "actor_rollout_ref.rollout.ignore_eos=True"))
    prompts = next(iter(trainer.train_loader))
    batch = prompts.repeat(trainer.config.actor_rollout_ref.rollout.n)
    gen = trainer.arr.generate_sequences(batch)
    assert bool(gen.batch["response_mask"].all()) and gen.batch["responses"].shape[-1] >= 2
    end_every_other_response_early(gen, trainer.arr.rollout.pad_id)
    batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    batch = batch.union(gen)
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape)
    batch.batch["ref_log_prob"] = batch.batch["rollout_log_probs"].clone()

    def grads(data):
        model = trainer.arr.model
        model.zero_grad()
        logits = response_logits(model, data.batch)
        log_prob = torch.log_softmax(logits, -1).gather(-1, data.batch["responses"][..., None])
        log_prob = log_prob.squeeze(-1)
        from engine.algorithms.policy_loss.base import PolicyLossInputs
        from engine.algorithms.policy_loss.vanilla import compute_policy_loss_vanilla
        from engine.config.actor import ActorConfig

        inputs = PolicyLossInputs(
            log_prob.detach(), log_prob, data.batch["advantages"], data.batch["response_mask"]
        )
        loss, _ = compute_policy_loss_vanilla(inputs, ActorConfig())
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss_a, grads_a = grads(batch)
    # Scramble everything outside the mask: advantages there and the pad tokens' attention.
    outside = batch.batch["response_mask"] == 0
    assert outside.any() and not outside.all()
    batch.batch["advantages"][outside] = 1e3
    loss_b, grads_b = grads(batch)
    torch.testing.assert_close(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b)


def test_resume_after_cancel_equals_an_uninterrupted_run(make_config, tmp_path):
    common = ("trainer.total_training_steps=4", "trainer.save_freq=-1")
    straight = PPOTrainer(
        make_config("grpo_tiny", *common, f"trainer.default_local_dir={tmp_path / 'a'}")
    )
    straight.recorder = ListRecorder()
    assert straight.fit() == "succeeded"

    resume_dir = f"trainer.default_local_dir={tmp_path / 'b'}"
    first = PPOTrainer(make_config("grpo_tiny", *common, resume_dir))
    first.recorder = ListRecorder(stop_after=2)
    assert first.fit() == "cancelled"
    assert first.global_step == 2
    assert first.recorder.checkpoints and first.recorder.checkpoints[-1][0] == 2

    second = PPOTrainer(make_config("grpo_tiny", *common, resume_dir))
    second.recorder = ListRecorder()
    assert second.fit() == "succeeded"
    assert [s for s, _ in second.recorder.steps] == [3, 4]
    expected = parameters(straight.arr.model)
    for key, value in parameters(second.arr.model).items():
        torch.testing.assert_close(value, expected[key], atol=0, rtol=0)
    scores_a = [m["critic/score/mean"] for _, m in straight.recorder.steps[2:]]
    scores_b = [m["critic/score/mean"] for _, m in second.recorder.steps]
    assert scores_a == scores_b


def test_ppo_with_a_critic_and_kl_in_reward(make_config):
    recorder = ListRecorder()
    status = run_training(make_config("ppo_tiny", "trainer.total_training_steps=2"), recorder)
    assert status == "succeeded"
    metrics = recorder.steps[-1][1]
    for key in ("critic/vf_loss", "critic/values/mean", "critic/vf_explained_var"):
        assert key in metrics
    assert "actor/reward_kl_penalty" in metrics


def test_validation_and_checkpoint_export_load(make_config, tmp_path):
    config = make_config(
        "grpo_tiny",
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        "trainer.save_freq=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    metrics = recorder.steps[-1][1]
    assert "val-core/tiny_arithmetic/reward/mean@1" in metrics
    assert any(s.split == "val" for s in recorder.samples)
    step, path = recorder.checkpoints[-1]
    model = AutoModelForCausalLM.from_pretrained(f"{path}/actor/huggingface")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_a_raising_reward_function_fails_its_samples_not_the_step(make_config, tmp_path):
    reward_file = tmp_path / "flaky_reward.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str.startswith('1'):\n"
        "        raise ValueError('no answers starting with 1')\n"
        "    return 1.0\n"
    )
    config = make_config(
        "grpo_tiny",
        "trainer.total_training_steps=1",
        f"custom_reward_function.path={reward_file}",
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    failed = [s for s in recorder.samples if s.reward_error]
    ok = [s for s in recorder.samples if not s.reward_error]
    assert all(s.response_text.startswith("1") for s in failed)
    assert all("no answers starting with 1" in s.reward_error for s in failed)
    assert all(s.reward == 0.0 for s in failed) and all(s.reward == 1.0 for s in ok)


@pytest.mark.slow
def test_the_verl_command_line_runs(tiny_assets, tmp_path):
    result = train_from_command_line(
        "algorithm.adv_estimator=grpo",
        f"data.train_files={tiny_assets.train_parquet}",
        f"data.val_files={tiny_assets.val_parquet}",
        "data.train_batch_size=16",
        "data.max_prompt_length=16",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={tiny_assets.model_dir}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "trainer.total_epochs=1",
        "trainer.total_training_steps=2",
        "trainer.test_freq=1",
        "trainer.save_freq=1",
        run_dir=tmp_path,
        timeout=600,
    )
    assert "step 2/2" in result.stdout
    assert (tmp_path / "global_step_2" / "trainer_state.pt").exists()
    rows = metric_rows(tmp_path)
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    assert "val-core/tiny_arithmetic/reward/mean@1" in rows[-1]
