"""Ulysses sequence parallelism equals the unsplit forward: 2 and 4 gloo CPU ranks, a tiny fp64 Qwen2.

Each case spawns the ranks; every rank saves what it computed and the test compares it with one
process running the same batch unsplit:

- the policy's log-probs and entropy, and the gradient of a fixed loss of them averaged over the
  ranks (FSDP2's reduction), through the lean runner (plain modules) with every group holding the
  whole batch;
- with the policy, reference and value model sharded by FSDP2 over all ranks (their own forward,
  attention through the registered ``"ulysses"`` function), the reference log-probs, the values,
  and one ``update_policy`` / ``update_critic`` step (SGD, lr 1: the weights' change is the
  gradient), each data-parallel group updating on its share of the batch.

Sizes: 2 ranks as one group of 2; 4 ranks as two groups of 2 (dp 2) and as one group of 4 (the
tiny model's 2 key/value heads repeated to 4). The batch has left-padded prompts and responses of
1 to 6 tokens, so packed rows end mid-slice and the padding to a multiple of sp is exercised.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from engine.config.schema import PPOConfig
from engine.roles.actor import PolicyActor
from engine.roles.critic import ValueCritic
from engine.roles.ulysses import check_heads, sequence_parallel_group
from tests.engine.distributed.helpers import tiny_policy
from tests.engine.roles.test_dynamic_bsz import (
    VOCAB,
    actor_config,
    minus,
    policy_batch,
    value_model,
    weights,
)

LENGTHS = [1, 6, 3, 6, 2, 5, 4, 2]  # response tokens of the 8 rows
LEFT_PADDING = [0, 2, 0, 1, 3, 0, 0, 2]  # prompt padding of each row (prompts of 4 tokens)
TEMPERATURE = 0.7
KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


def ulysses_batch():
    """Return ``policy_batch`` with left-padded prompts: 8 rows, real lengths 3 to 10."""
    batch = policy_batch(LENGTHS)
    mask = batch.batch["attention_mask"]
    for row, pad in enumerate(LEFT_PADDING):
        mask[row, :pad] = 0
    batch.batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    return batch


def critic_config():
    cfg = copy.deepcopy(PPOConfig().critic)
    cfg.ppo_epochs, cfg.grad_clip, cfg.loss_agg_mode = 1, 1e9, "token-mean"
    return cfg


def fixed_loss(log_probs: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A loss that weighs every response token's log-prob and entropy differently."""
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    return ((log_probs * weight + 0.1 * entropy) * mask).sum()


def lean_pass(actor: PolicyActor, batch) -> dict[str, torch.Tensor]:
    """Log-probs and entropy (no grad), then the gradient of :func:`fixed_loss` of them."""
    from engine.algorithms.torch_functional import entropy_from_logits, logprobs_from_logits

    log_probs, entropy = actor.compute_log_prob(
        batch, micro_batch_size=3, temperature=TEMPERATURE, with_entropy=True
    )
    logits = actor.forward(actor.model, batch.batch, TEMPERATURE)
    loss = fixed_loss(
        logprobs_from_logits(logits, batch.batch["responses"]),
        entropy_from_logits(logits),
        batch.batch["response_mask"],
    )
    loss.backward()
    grads = {name: p.grad.clone() for name, p in actor.model.named_parameters()}
    return {"log_probs": log_probs, "entropy": entropy, "grads": grads}


def _rank(rank: int, world: int, sp_size: int, port: int, folder: str) -> None:
    """One gloo rank: the lean pass on the whole batch, then the FSDP2 roles on its group's share."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from engine.distributed.fsdp import apply_fsdp2, gather_full_state_dict
    from engine.distributed.process_group import build_device_mesh, init_process_group

    torch.set_num_threads(1)
    init_process_group(rank=rank, world_size=world, host="127.0.0.1", port=port, backend="gloo")
    sp = sequence_parallel_group(sp_size, KEY)
    batch = ulysses_batch()
    saved: dict = {}

    # The lean runner on plain modules; gradients averaged over all ranks as FSDP2 would.
    policy = tiny_policy(VOCAB, seed=1).double()
    actor = PolicyActor(
        policy, actor_config("token-mean"), remove_padding=True, sequence_parallel=sp
    )
    saved["lean"] = lean_pass(actor, batch)
    for grad in saved["lean"]["grads"].values():
        dist.all_reduce(grad)
        grad /= world

    # FSDP2 over all ranks: each data-parallel group updates on its share of the batch.
    dp = world // sp_size
    share = batch[rank // sp_size * 8 // dp : (rank // sp_size + 1) * 8 // dp]
    fsdp = SimpleNamespace(param_offload=False, mixed_precision="fp32", reshard_after_forward=True)
    mesh = build_device_mesh("cpu", world)
    ref_policy = apply_fsdp2(tiny_policy(VOCAB, seed=1).double(), mesh, fsdp, "cpu", "ref")
    reference = PolicyActor(
        ref_policy, actor_config("token-mean"), remove_padding=True, sequence_parallel=sp
    )
    saved["ref_log_probs"], _ = reference.compute_log_prob(
        batch, micro_batch_size=3, temperature=TEMPERATURE, with_entropy=False
    )
    model = tiny_policy(VOCAB, seed=1).double()
    before = weights(model)
    apply_fsdp2(model, mesh, fsdp, "cpu", "actor")
    actor = PolicyActor(
        model,
        actor_config("token-mean"),
        torch.optim.SGD(model.parameters(), lr=1),
        remove_padding=True,
        sequence_parallel=sp,
    )
    saved["actor_metrics"] = actor.update_policy(
        share, mini_batch_size=len(share), micro_batch_size=2, temperature=1.0
    )
    after = gather_full_state_dict(model)  # on rank 0; empty elsewhere
    saved["actor_grad"] = minus(before, after) if rank == 0 else None

    model = value_model()
    before = weights(model)
    apply_fsdp2(model, mesh, fsdp, "cpu", "critic")
    critic = ValueCritic(
        model,
        critic_config(),
        torch.optim.SGD(model.parameters(), lr=1),
        remove_padding=True,
        sequence_parallel=sp,
    )
    saved["values"] = critic.compute_values(batch, micro_batch_size=3)
    critic.update_critic(share, mini_batch_size=len(share), micro_batch_size=2)
    after = gather_full_state_dict(model)
    saved["critic_grad"] = minus(before, after) if rank == 0 else None
    torch.save(saved, os.path.join(folder, f"rank{rank}.pt"))
    dist.barrier()  # no rank tears gloo down while another may still use it
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads may abort at interpreter exit; the result is saved


def unsplit() -> dict:
    """The same passes in one process, without sequence parallelism."""
    batch = ulysses_batch()
    saved: dict = {}
    actor = PolicyActor(
        tiny_policy(VOCAB, seed=1).double(), actor_config("token-mean"), remove_padding=True
    )
    saved["lean"] = lean_pass(actor, batch)
    saved["ref_log_probs"] = saved["lean"]["log_probs"]
    model = tiny_policy(VOCAB, seed=1).double()
    before = weights(model)
    actor = PolicyActor(
        model,
        actor_config("token-mean"),
        torch.optim.SGD(model.parameters(), lr=1),
        remove_padding=True,
    )
    saved["actor_metrics"] = actor.update_policy(
        batch, mini_batch_size=8, micro_batch_size=2, temperature=1.0
    )
    saved["actor_grad"] = minus(before, model.state_dict())
    model = value_model()
    before = weights(model)
    critic = ValueCritic(
        model, critic_config(), torch.optim.SGD(model.parameters(), lr=1), remove_padding=True
    )
    saved["values"] = critic.compute_values(batch, micro_batch_size=3)
    critic.update_critic(batch, mini_batch_size=8, micro_batch_size=2)
    saved["critic_grad"] = minus(before, model.state_dict())
    return saved


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def reference():
    return unsplit()


@pytest.mark.slow
@pytest.mark.parametrize(("world", "sp_size"), [(2, 2), (4, 2), (4, 4)])
def test_ulysses_ranks_equal_the_unsplit_forward_and_gradients(tmp_path, reference, world, sp_size):
    import torch.multiprocessing as mp

    from engine.distributed.process_group import free_port

    mp.start_processes(
        _rank, args=(world, sp_size, free_port(), str(tmp_path)), nprocs=world, start_method="spawn"
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    mask = ulysses_batch().batch["response_mask"].bool()
    one = reference
    assert max(g.abs().max().item() for g in one["actor_grad"].values()) > 1e-3  # a real gradient
    for saved in ranks:
        lean = saved["lean"]
        for key in ("log_probs", "entropy"):
            assert (lean[key] - one["lean"][key])[mask].abs().max() < 1e-5
        assert max_diff(lean["grads"], one["lean"]["grads"]) < 1e-5
        assert (saved["ref_log_probs"] - one["ref_log_probs"])[mask].abs().max() < 1e-5
        assert (saved["values"] - one["values"])[mask].abs().max() < 1e-5
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss"):
        # the worker group reports the mean over ranks: the mini-batch's loss
        mean = sum(r["actor_metrics"][key] for r in ranks) / world
        assert mean == pytest.approx(one["actor_metrics"][key], abs=1e-9)
    assert max_diff(ranks[0]["actor_grad"], one["actor_grad"]) < 1e-5
    assert max_diff(ranks[0]["critic_grad"], one["critic_grad"]) < 1e-5


def test_heads_that_do_not_split_are_refused_naming_the_key_and_a_size_that_works():
    config = tiny_policy(VOCAB).config  # 4 attention heads, 2 key/value heads
    check_heads(config, 2, KEY)
    check_heads(config, 4, KEY)  # the 2 key/value heads are repeated to 4
    with pytest.raises(ValueError, match=f"{KEY}=8: the model has 4 attention heads .* such as 4"):
        check_heads(config, 8, KEY)
    with pytest.raises(ValueError, match=f"{KEY}=3: .* such as 2"):
        check_heads(config, 3, KEY)


def test_a_size_that_does_not_divide_the_ranks_is_refused_naming_the_key():
    assert sequence_parallel_group(1, KEY) is None  # off: no group
    with pytest.raises(ValueError, match=f"{KEY}=2 must divide the 1 ranks of the role's pool"):
        sequence_parallel_group(2, KEY)


def test_one_process_refuses_a_split_forward_without_packed_rows():
    with pytest.raises(ValueError, match="set critic.model.use_remove_padding=True"):
        ValueCritic(value_model(), critic_config(), None, sequence_parallel=object())
