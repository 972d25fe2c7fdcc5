"""FSDP2 helpers in one process: precision and offload rules, sharding, state round trips."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from engine.distributed.fsdp import (
    apply_fsdp2,
    check_offload,
    copy_full_weights,
    decoder_layers,
    gather_full_state_dict,
    load_sharded_state_dict,
    mixed_precision_policy,
    sharded_state_dict,
)
from engine.distributed.process_group import (
    build_device_mesh,
    free_port,
    init_process_group,
)
from engine.roles.model_loading import frozen_copy
from tests.engine.distributed.helpers import tiny_policy


def fsdp_config(**overrides):
    values = dict(
        param_offload=False,
        optimizer_offload=False,
        reshard_after_forward=True,
        fsdp_size=-1,
        mixed_precision="auto",
    )
    return SimpleNamespace(**{**values, **overrides})


def test_offload_on_a_cpu_is_refused_with_the_keys_and_the_fix():
    with pytest.raises(ValueError) as info:
        check_offload(
            fsdp_config(param_offload=True, optimizer_offload=True), "cpu", "critic.model"
        )
    message = str(info.value)
    assert "critic.model.fsdp_config.param_offload=True" in message
    assert "offload is unavailable on a CPU device" in message
    assert "critic.model.fsdp_config.optimizer_offload=False" in message
    check_offload(fsdp_config(param_offload=True), "cuda", "critic.model")  # allowed on a GPU
    check_offload(fsdp_config(), "cpu", "critic.model")


def test_mixed_precision_is_bf16_with_fp32_reduction_on_a_gpu_and_fp32_on_a_cpu():
    gpu = mixed_precision_policy("auto", "cuda")
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    cpu = mixed_precision_policy("auto", "cpu")
    assert (cpu.param_dtype, cpu.reduce_dtype) == (None, None)
    with pytest.raises(ValueError, match="needs a CUDA device; on a CPU use .*fp32"):
        mixed_precision_policy("bf16", "cpu")
    with pytest.raises(ValueError, match="is not one of auto, bf16, fp16, fp32"):
        mixed_precision_policy("int8", "cuda")


def test_decoder_layers_are_found_from_no_split_modules():
    model = tiny_policy(40)
    assert decoder_layers(model) == list(model.model.layers)
    with pytest.raises(ValueError, match="cannot find the decoder layers of Linear"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_fsdp_size_must_divide_the_world():
    with pytest.raises(ValueError, match="fsdp_size=3 must be -1 or a divisor of the 4 ranks"):
        build_device_mesh("cpu", 4, 3)


@pytest.fixture(scope="module")
def one_rank_group():
    init_process_group(rank=0, world_size=1, host="127.0.0.1", port=free_port(), backend="gloo")
    yield build_device_mesh("cpu", 1)
    dist.destroy_process_group()


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # One rank's gathered tensors can share storage with the parameters: copy them.
    return {k: v.clone() for k, v in gather_full_state_dict(model).items()}


def adamw_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    model(input_ids=ids, use_cache=False).logits.logsumexp(-1).mean().backward()
    optimizer.step()


def test_sharded_state_round_trip_restores_weights_and_optimizer(one_rank_group):
    model = apply_fsdp2(tiny_policy(40), one_rank_group, fsdp_config(), "cpu", "actor")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    adamw_step(model, optimizer, seed=0)
    saved = sharded_state_dict(model, optimizer)
    assert all(type(t) is torch.Tensor for t in saved["model"].values())  # plain, picklable
    adamw_step(model, optimizer, seed=1)
    expected = full_weights(model)
    load_sharded_state_dict(model, optimizer, saved)
    assert not all(torch.equal(expected[k], v) for k, v in full_weights(model).items())
    adamw_step(model, optimizer, seed=1)  # the same step from the restored state
    restored = full_weights(model)
    assert restored.keys() == expected.keys()
    assert all(torch.equal(expected[k], restored[k]) for k in expected)


def test_a_checkpoint_shard_of_another_shape_names_the_fix(one_rank_group):
    model = apply_fsdp2(tiny_policy(40), one_rank_group, fsdp_config(), "cpu", "actor")
    state = sharded_state_dict(model, None)
    state["model"]["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="model.norm.weight.*same trainer.nnodes"):
        load_sharded_state_dict(model, None, state)


def test_copy_full_weights_fills_an_unsharded_twin(one_rank_group):
    model = tiny_policy(40, seed=1)
    twin = frozen_copy(tiny_policy(40, seed=2))
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    apply_fsdp2(model, one_rank_group, fsdp_config(), "cpu", "actor")
    copy_full_weights(model, twin, torch.device("cpu"))
    assert all(torch.equal(reference[k], v) for k, v in twin.state_dict().items())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_fsdp_trains_in_bf16_and_keeps_fp32_master_weights():
    init_process_group(rank=0, world_size=1, host="127.0.0.1", port=free_port(), backend="nccl")
    try:
        mesh = build_device_mesh("cuda", 1)
        model = apply_fsdp2(tiny_policy(40).cuda(), mesh, fsdp_config(), "cuda", "actor")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        before = full_weights(model)
        ids = torch.randint(0, 40, (2, 6), device="cuda")
        logits = model(input_ids=ids, use_cache=False).logits
        assert logits.dtype == torch.bfloat16
        logits.float().logsumexp(-1).mean().backward()
        optimizer.step()
        after = gather_full_state_dict(model)
        assert all(v.dtype == torch.float32 for v in after.values())
        assert any(not torch.equal(before[k], after[k]) for k in before)
    finally:
        dist.destroy_process_group()
