"""The optimal token baselines' input through the worker group (FSDP2 ranks, here the in-process
CPU rank): the group's old-log-prob call returns ``sum_pi_squared`` like the plain worker's."""

from __future__ import annotations

import torch

from engine.distributed.local_group import LocalWorkerGroup
from engine.distributed.worker_group import ActorRolloutRefGroup
from engine.roles.actor import response_logits
from tests.engine.distributed.helpers import plain_worker, prompt_batch, tiny_config

QUESTIONS = ["1+2=", "13+4=", "5+60=", "7+8="]


def test_the_group_returns_sum_pi_squared_for_the_token_baselines(fresh_group):
    config = tiny_config(lr=1e-2, mini_batch=4, n=2)
    config.algorithm.adv_estimator = "optimal_token_baseline"
    config.actor_rollout_ref.rollout.temperature = 0.8
    group = LocalWorkerGroup("cpu")
    try:
        arr = ActorRolloutRefGroup(group, config, total_steps=10, need_ref=False)
        local = plain_worker(config, arr.full_state_dict())
        prompts = prompt_batch(config.actor_rollout_ref.model.tokenizer, QUESTIONS).repeat(2)
        gen = arr.generate_sequences(prompts)
        out = arr.compute_log_prob(gen).batch
        expected = local.compute_log_prob(gen).batch
        assert set(out.keys()) == {"old_log_probs", "entropys", "sum_pi_squared"}
        mask = gen.batch["response_mask"].bool()
        torch.testing.assert_close(out["sum_pi_squared"], expected["sum_pi_squared"])
        with torch.no_grad():
            logits = response_logits(local.model, gen.batch, lean=False).double()
        direct = (torch.softmax(logits / 0.8, dim=-1) ** 2).sum(-1)
        torch.testing.assert_close(
            out["sum_pi_squared"][mask].double(), direct[mask], atol=1e-6, rtol=1e-5
        )
        # Another estimator does not pay for it.
        local.config.algorithm.adv_estimator = "grpo"
        assert "sum_pi_squared" not in local.compute_log_prob(gen).batch
    finally:
        group.shutdown()
