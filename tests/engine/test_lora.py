"""LoRA policies with PEFT on a random small Qwen2 (CPU)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from engine.config import PPOConfig
from engine.data import DataProto
from engine.lora import (
    adapter_disabled,
    adapter_settings,
    apply_lora,
    export_lora,
    is_lora,
    merged_state_dict,
)
from engine.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.roles.model_loading import load_policy
from engine.rollout.served import named_weights
from engine.tiny.tokenizer import build_tokenizer
from tests.engine.distributed.helpers import tiny_policy

pytest.importorskip("peft")

VOCAB = 103  # the character tokenizer's vocabulary


def base_model(seed: int = 0) -> Qwen2ForCausalLM:
    return tiny_policy(VOCAB, seed, max_positions=128)


def lora_config(**overrides) -> SimpleNamespace:
    return SimpleNamespace(
        **{"lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear", **overrides}
    )


def train_step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """One AdamW step on next-token cross-entropy over ``ids`` (bs, L)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    logits = model(input_ids=ids).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()


IDS = torch.randint(7, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))


def update_batch(ids: torch.Tensor, advantages: list[float], **extra: torch.Tensor) -> DataProto:
    """Return an update batch over ``ids`` (bs, 9): its last 4 tokens the response, one
    advantage per row on every response token, and ``extra`` columns."""
    responses = ids[:, 5:]
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": mask.cumsum(-1) - 1,
            "responses": responses,
            "response_mask": torch.ones_like(responses),
            "advantages": torch.tensor(advantages)[:, None].expand(-1, 4).contiguous(),
            **extra,
        }
    )


def test_only_adapter_parameters_require_grad():
    model = apply_lora(base_model(), lora_config())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear adapts the attention and MLP projections of every layer, not the output head.
    for layer in range(2):
        for proj in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
            assert any(f"layers.{layer}.{proj}.lora_A" in n for n in trainable)
    assert not any("lm_head" in n or "embed_tokens" in n for n in trainable)


def test_a_list_of_target_modules_adapts_only_those():
    model = apply_lora(base_model(), lora_config(target_modules=["q_proj", "v_proj"]))
    adapted = {
        n.split(".lora_")[0].rsplit(".", 1)[-1]
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    assert adapted == {"q_proj", "v_proj"}


def test_unknown_target_modules_name_the_key():
    with pytest.raises(ValueError, match="actor_rollout_ref.model.target_modules"):
        apply_lora(base_model(), lora_config(target_modules=["no_such_proj"]))


def test_a_training_update_changes_only_the_adapter():
    model = apply_lora(base_model(), lora_config())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model, IDS)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_A." in n or ".lora_B." in n for n in changed)
    assert any(".lora_B." in n for n in changed)  # B starts at zero and moves


def test_the_adapter_disabled_policy_is_the_base_model():
    base = base_model()
    pristine = copy.deepcopy(base)
    model = apply_lora(base, lora_config())
    train_step(model, IDS)
    with torch.no_grad():
        adapted = model(input_ids=IDS).logits
        with adapter_disabled(model):
            reference = model(input_ids=IDS).logits
        expected = pristine(input_ids=IDS).logits
        torch.testing.assert_close(reference, expected)
        assert not torch.allclose(adapted, expected)
        assert torch.equal(model(input_ids=IDS).logits, adapted)  # re-enabled after the block


def test_merged_export_loads_with_from_pretrained_and_matches_the_adapted_model(tmp_path):
    model = apply_lora(base_model(), lora_config())
    train_step(model, IDS)
    export_lora(model, tmp_path / "merged", tokenizer=build_tokenizer())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not is_lora(loaded)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=IDS).logits, model(input_ids=IDS).logits, atol=1e-5, rtol=1e-5
        )
    assert (tmp_path / "merged" / "tokenizer_config.json").exists()


def test_adapter_only_export_round_trips_with_peft(tmp_path):
    from peft import PeftModel

    model = apply_lora(base_model(), lora_config())
    train_step(model, IDS)
    export_lora(model, tmp_path / "adapter", merge=False)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    reloaded = PeftModel.from_pretrained(base_model(), tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=IDS).logits, model(input_ids=IDS).logits)


def test_merged_state_dict_has_base_names_and_leaves_the_model_unchanged():
    model = apply_lora(base_model(), lora_config())
    train_step(model, IDS)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    merged = merged_state_dict(model)
    assert set(merged) == set(base_model().state_dict())
    assert all(torch.equal(p, state[n]) for n, p in model.named_parameters())
    # The rollout engine receives the same base names for a LoRA policy.
    assert {name for name, _ in named_weights(model)} == set(merged)


def test_load_policy_wraps_the_model_when_lora_rank_is_positive():
    config = SimpleNamespace(
        hf_model=base_model(), enable_gradient_checkpointing=True, **vars(lora_config())
    )
    model = load_policy(config, torch.device("cpu")).train()
    assert is_lora(model)
    train_step(model, IDS)  # checkpointed blocks still get gradients through frozen embeddings
    grads = [p.grad for n, p in model.named_parameters() if ".lora_B." in n]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    plain = load_policy(SimpleNamespace(hf_model=base_model(), lora_rank=0), torch.device("cpu"))
    assert not is_lora(plain)


def test_load_policy_starts_from_a_saved_adapter_and_trains_it_on(tmp_path):
    trained = apply_lora(base_model(), lora_config(lora_rank=2, lora_alpha=4))
    train_step(trained, IDS)
    export_lora(trained, tmp_path / "adapter", merge=False)
    # lora_rank 0 and another alpha: the adapter's own settings apply, as in verl.
    config = SimpleNamespace(
        hf_model=base_model(),
        lora_rank=0,
        lora_alpha=16,
        lora_adapter_path=str(tmp_path / "adapter"),
    )
    model = load_policy(config, torch.device("cpu"))
    assert is_lora(model) and adapter_settings(model)["r"] == 2
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, trained(input_ids=IDS).logits)
        with adapter_disabled(model):  # the reference: the base model
            torch.testing.assert_close(
                model(input_ids=IDS).logits, base_model()(input_ids=IDS).logits
            )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    train_step(model, IDS)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)


def test_a_folder_without_an_adapter_is_refused_naming_the_key(tmp_path):
    from engine.config.fields import ConfigValidationError
    from engine.config.loader import load_config
    from engine.config.validate import validate_config

    key = "actor_rollout_ref.model.lora_adapter_path"
    with pytest.raises(ValueError, match=f"{key}=.*holds no adapter_config.json"):
        load_policy(
            SimpleNamespace(hf_model=base_model(), lora_adapter_path=str(tmp_path)),
            torch.device("cpu"),
        )
    cfg = load_config("grpo_tiny", [f"{key}={tmp_path}"])
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(cfg, check_files=True)
    assert any(
        e.key == key and "holds no adapter_config.json" in e.message for e in caught.value.errors
    )
    missing = load_config("grpo_tiny", [f"{key}={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigValidationError, match="does not exist; point it at a saved LoRA"):
        validate_config(missing, check_files=True)


def test_the_worker_reference_is_the_adapter_disabled_policy_with_no_copy():
    tokenizer = build_tokenizer()
    pristine = base_model()
    cfg = PPOConfig()
    arr = cfg.actor_rollout_ref
    arr.model.hf_model, arr.model.tokenizer = copy.deepcopy(pristine), tokenizer
    arr.model.lora_rank, arr.model.lora_alpha = 4, 8
    arr.model.enable_gradient_checkpointing = False
    worker = ActorRolloutRefWorker(cfg, device=torch.device("cpu"), total_steps=1, need_ref=True)
    assert worker.ref_model is None and is_lora(worker.model)
    train_step(worker.model, IDS)

    responses = IDS[:, 5:]
    mask = torch.ones_like(IDS)
    batch = DataProto.from_dict(
        {
            "input_ids": IDS,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1),
            "responses": responses,
            "response_mask": torch.ones_like(responses),
        }
    )
    ref = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]  # (3, 4)
    with torch.no_grad():
        logits = pristine(input_ids=IDS).logits[:, 4:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1)
    torch.testing.assert_close(ref, expected, atol=1e-5, rtol=1e-5)
    policy = worker.compute_log_prob(batch).batch["old_log_probs"]
    assert not torch.allclose(policy, expected)  # the adapter is back on for the policy


def _lora_rank_update(rank: int, world_size: int, port: int, out: str) -> None:
    """One gloo rank: a LoRA policy sharded by FSDP2 with the GPU's precision (bf16 compute, fp32
    master weights and reduction), its first forward the reference pass, then one update."""
    import os

    import torch.distributed as dist

    import engine.distributed.fsdp as fsdp
    from engine.distributed.process_group import init_process_group
    from engine.distributed.rank_worker import ShardedActorRolloutRef

    torch.set_num_threads(1)
    # The CPU path refuses bf16 (fsdp_config.mixed_precision); give it the policy a GPU gets.
    gpu_policy = fsdp.mixed_precision_policy("auto", "cuda")
    assert (gpu_policy.param_dtype, gpu_policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    fsdp.mixed_precision_policy = lambda setting, device_type: gpu_policy
    init_process_group(
        rank=rank, world_size=world_size, host="127.0.0.1", port=port, backend="gloo"
    )
    cfg = PPOConfig()
    arr = cfg.actor_rollout_ref
    arr.model.hf_model, arr.model.tokenizer = base_model(), build_tokenizer()
    arr.model.lora_rank, arr.model.lora_alpha = 4, 8
    arr.model.enable_gradient_checkpointing = False
    arr.actor.ppo_mini_batch_size = 2 * world_size
    worker = ShardedActorRolloutRef(
        cfg,
        device=torch.device("cpu"),
        rank=rank,
        world_size=world_size,
        total_steps=2,
        need_ref=True,
    )
    assert worker.sharded and is_lora(worker.worker.model)
    # On a CPU rank the gathered tensors can share the live parameters' memory: copy them.
    before = {k: v.clone() for k, v in worker.full_state_dict().items()}
    ids = torch.randint(7, VOCAB, (2, 9), generator=torch.Generator().manual_seed(rank))
    batch = update_batch(ids, [1.0, -1.0])
    # The first forward runs with the adapter off, so PEFT has cleared its requires_grad.
    batch.batch["ref_log_prob"] = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
    metrics: dict[str, float] = {}
    try:
        metrics = worker.update_actor(batch)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    after = worker.full_state_dict() if error is None else {}
    if rank == 0:
        torch.save({"error": error, "metrics": metrics, "before": before, "after": after}, out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort at interpreter exit; the result is saved


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_lora_policy_trains_under_fsdp2_bf16_when_the_reference_pass_runs_first(
    tmp_path, world_size
):
    # FSDP2 fixes each group's gradient dtypes at its first forward, from what requires grad
    # then; PEFT's disabled adapter required none, and the first backward assigned bf16
    # gradients to fp32 parameters (seen on an H200). The wrapping now fixes them at once.
    import torch.multiprocessing as mp

    from engine.distributed.process_group import free_port

    out = str(tmp_path / "rank0.pt")
    mp.start_processes(
        _lora_rank_update,
        args=(world_size, free_port(), out),
        nprocs=world_size,
        start_method="spawn",
    )
    result = torch.load(out)
    assert result["error"] is None, result["error"]
    assert result["metrics"]["actor/grad_norm"] > 0
    before, after = result["before"], result["after"]
    assert set(before) == set(after)
    assert all(v.dtype == torch.float32 for v in after.values())  # fp32 master weights
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_A." in k or ".lora_B." in k for k in changed)
    assert any(".lora_B." in k for k in changed)  # B starts at zero and moves


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_lora_policy_trains_its_adapter_on_a_cuda_rank(fresh_group):
    # The CUDA trainer's path: a PEFT-wrapped policy on a one-rank NCCL group (FSDP2, bf16
    # compute), its reference the adapter-disabled policy; an update moves the adapter only.
    # Failed on an H200 before apply_fsdp2 settled FSDP2's gradient dtypes at wrap time (the
    # reference pass ran first, with the adapter off): docs/gpu.md, "LoRA on a CUDA rank".
    from torch.distributed.tensor import DTensor

    from engine.distributed.local_group import LocalWorkerGroup
    from engine.distributed.worker_group import ActorRolloutRefGroup

    cfg = PPOConfig()
    arr = cfg.actor_rollout_ref
    arr.model.hf_model, arr.model.tokenizer = base_model(), build_tokenizer()
    arr.model.lora_rank, arr.model.lora_alpha = 4, 8
    arr.model.enable_gradient_checkpointing = False
    arr.actor.ppo_mini_batch_size = 3
    group = LocalWorkerGroup("cuda")
    proxy = ActorRolloutRefGroup(group, cfg, total_steps=2, need_ref=True)
    model = group.worker.roles["actor_rollout_ref"].worker.model
    assert is_lora(model)

    def full(state):
        return {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().float().cpu().clone()
            for k, v in state.items()
        }

    before = full(model.state_dict())
    batch = update_batch(IDS, [1.0, -1.0, 0.5], ref_log_prob=torch.zeros(3, 4))
    batch.batch["ref_log_prob"] = proxy.compute_ref_log_prob(batch).batch["ref_log_prob"]
    proxy.update_actor(batch)
    after = full(model.state_dict())
    changed = {k for k in before if (before[k] - after[k]).abs().max() > 0}
    assert changed and all("lora_" in k for k in changed)
