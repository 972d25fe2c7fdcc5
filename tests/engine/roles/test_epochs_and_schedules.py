"""verl keys read by the workers: the PPO-epoch shuffle seed (``data_loader_seed``), the cosine
schedule's ``num_cycles`` and the critic's values-pass sizes (``forward_*``)."""

from __future__ import annotations

import copy
import math

import torch

from engine.config.loader import load_config
from engine.config.resolve import resolve_config
from engine.config.schema import PPOConfig
from engine.data import DataProto
from engine.roles.batch_sizes import epoch_batches
from engine.roles.optim import build_lr_scheduler


def rows(n: int = 16) -> DataProto:
    return DataProto.from_dict({"index": torch.arange(n)})


def orders(config) -> list[list[int]]:
    return [batch.batch["index"].tolist() for batch in epoch_batches(rows(), config)]


def test_data_loader_seed_decides_the_shuffle_between_ppo_epochs():
    actor = copy.deepcopy(PPOConfig().actor_rollout_ref.actor)
    actor.ppo_epochs, actor.shuffle = 3, True
    first = orders(actor)
    assert len(first) == 3 and len({tuple(o) for o in first}) == 3  # each epoch its own order
    assert all(sorted(o) == list(range(16)) for o in first)
    assert orders(actor) == first  # the same actor.data_loader_seed, the same orders
    actor.data_loader_seed = 7
    assert orders(actor) != first
    actor.shuffle = False
    assert orders(actor) == [list(range(16))] * 3


def test_the_critic_shuffles_its_epochs_by_its_own_data_loader_seed():
    cfg = resolve_config(load_config("ppo_tiny", ["critic.ppo_epochs=2", "critic.shuffle=True"]))
    first = orders(cfg.critic)
    cfg.critic.data_loader_seed = 1
    assert orders(cfg.critic) != first and len(first) == 2


def lrs(optim, total: int = 10, steps: int | None = None) -> list[float]:
    """Return the learning rates of the first ``steps`` (all ``total``) steps of ``optim``'s
    schedule over ``total`` steps, from a base rate of 1."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, optim, total)
    out = []
    for _ in range(total if steps is None else steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_lr_scheduler_type_and_num_cycles_shape_the_cosine_schedule():
    cfg = resolve_config(
        load_config("grpo_tiny", ["actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"])
    )
    optim = cfg.actor_rollout_ref.actor.optim
    half = lrs(optim)
    assert half == [0.5 * (1 + math.cos(math.pi * step / 10)) for step in range(10)]
    optim.num_cycles = 1.0  # one whole wave: down and back up
    whole = lrs(optim)
    assert whole[5] == min(whole) and whole[9] > whole[5]
    optim.warmup_style = optim.lr_scheduler_type = "constant"
    assert lrs(optim) == [1.0] * 10


def test_the_critic_values_pass_uses_the_forward_sizes():
    from engine.roles.critic import CriticWorker

    cfg = resolve_config(
        load_config(
            "ppo_tiny",
            [
                "critic.ppo_micro_batch_size_per_gpu=4",
                "critic.forward_micro_batch_size_per_gpu=2",
                "critic.use_dynamic_bsz=True",
                "critic.ppo_max_token_len_per_gpu=64",
                "critic.forward_max_token_len_per_gpu=48",
            ],
        )
    )
    worker = CriticWorker(cfg, total_steps=1, device=torch.device("cpu"))
    assert (worker.micro_batch_size, worker.max_token_len) == (4, 64)
    assert (worker.forward_micro_batch_size, worker.forward_max_token_len) == (2, 48)
    unset = resolve_config(load_config("ppo_tiny", ["critic.ppo_micro_batch_size_per_gpu=4"]))
    assert (
        CriticWorker(unset, total_steps=1, device=torch.device("cpu")).forward_micro_batch_size == 4
    )  # follows ppo_*
