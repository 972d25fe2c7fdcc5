"""vLLM on FSDP2 ranks (gloo, CPU): the engines take the gathered policy after an update.

Two processes form a gloo world, shard the tiny model with FSDP2 and step it; then the ranks'
``VLLMRollout`` (``distributed_executor_backend="external_launcher"``, started inside that world)
loads the sharded weights, gathered tensor by tensor on both ranks, and decodes greedily exactly
as an unsharded copy that took the same step (and, before it, as the unchanged copy). With
``tensor_model_parallel_size=1`` each rank has an engine of its own and decodes its own share, of
another size and length than the other's, with no collective between the engines; with 2, the
two ranks are one engine, each holding half of every layer: as in the trainer's worker, they
gather both shares, decode them in one call and each keeps its own rows, in order. Then the Ray
path: ``trainer.controller=ray`` with two ranks and ``rollout.name=vllm``, with one engine per
rank and with one engine over both. Last, two runs on one machine whose engines over their ranks
0 and 1 start at the same time.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.engine.rollout.test_vllm_engine import KV_CACHE_BYTES, LOGP_ATOL
from tests.engine.tiny_run import short_run
from tests.vllm_tests import requires_vllm

pytestmark = [
    pytest.mark.slow,
    requires_vllm,
]

# Each rank's share: a different number of prompts and, with one engine per rank, of new tokens.
SHARES = {0: (["12+35=", "40+41="], 6), 1: (["7+8=", "99+1=", "3+3=", "55+20=", "18+9="], 12)}
NEW_TOKENS = 12  # one engine over both ranks generates both shares in one call


def _rank(rank: int, world: int, port: int, out: str, tp: int) -> None:
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config import RolloutConfig
    from engine.config.actor import FSDPConfig
    from engine.config.rollout import EngineKwargsConfig
    from engine.distributed.fsdp import apply_fsdp2
    from engine.distributed.process_group import build_device_mesh, init_process_group
    from engine.rollout.tensor_parallel import (
        TensorParallelShare,
        engine_seed,
        tensor_parallel_group,
    )
    from engine.rollout.vllm_rollout import VLLMRollout
    from engine.tiny import ensure_tiny_assets
    from tests.engine.distributed.helpers import prompt_batch
    from tests.engine.rollout.test_vllm_engine import greedy_of

    init_process_group(rank=rank, world_size=world, host="127.0.0.1", port=port, backend="gloo")
    path = str(ensure_tiny_assets().model_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    reference = copy.deepcopy(model)  # unsharded, takes the same step
    apply_fsdp2(model, build_device_mesh("cpu", world), FSDPConfig(), "cpu", "actor")
    config = RolloutConfig(
        name="vllm",
        dtype="float32",
        max_model_len=64,
        tensor_model_parallel_size=tp,
        engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": KV_CACHE_BYTES}),
    )
    # As the trainer's worker builds it: one seed per engine, the group's prompts gathered.
    group = tensor_parallel_group(tp, "actor_rollout_ref.rollout.tensor_model_parallel_size")
    rollout = VLLMRollout(path, tokenizer, config, seed=engine_seed(0, rank, tp))
    if group is not None:
        rollout = TensorParallelShare(rollout, group)
    questions, new_tokens = SHARES[rank]
    new_tokens = new_tokens if tp == 1 else NEW_TOKENS  # one engine call: one length
    batch = prompt_batch(tokenizer, questions)
    greedy = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}
    before = rollout.generate_sequences(batch, max_new_tokens=new_tokens, sampling=greedy)
    expected_before = greedy_of(reference.eval(), tokenizer, batch, max_new_tokens=new_tokens)

    ids = prompt_batch(tokenizer, ["12+35=47", "7+8=15"]).batch["input_ids"]
    for module in (model, reference):  # the same data on both ranks: the averaged gradient is it
        optimizer = torch.optim.AdamW(module.parameters(), lr=5e-3)
        module(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    stats = rollout.load_weights(model)  # every rank gathers every tensor, in the same order
    after = rollout.generate_sequences(batch, max_new_tokens=new_tokens, sampling=greedy)
    expected = greedy_of(reference.eval(), tokenizer, batch, max_new_tokens=new_tokens)
    result = {
        "tensors": stats["tensors"],
        "changed": not torch.equal(before.batch["responses"], after.batch["responses"]),
        "equal_before": same_answers(before, expected_before, tokenizer.pad_token_id),
        "equal": same_answers(after, expected, tokenizer.pad_token_id),
        "rows": len(after.batch["responses"]),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    # Leave together: a rank that exits while the other still uses rank 0's store aborts it.
    dist.barrier()
    dist.destroy_process_group()


def same_answers(out, expected: torch.Tensor, pad_token_id: int) -> bool:
    """Whether ``out``'s responses are ``expected``'s, row by row; with one engine over both
    ranks they are as wide as the longer share's, the rest right-padding."""
    responses = out.batch["responses"]
    width = expected.shape[1]
    return torch.equal(responses[:, :width], expected) and bool(
        (responses[:, width:] == pad_token_id).all()
    )


@pytest.mark.parametrize("tp", [1, 2], ids=["an-engine-per-rank", "one-engine-over-both"])
def test_fsdp2_ranks_sync_into_vllm_and_decode_as_the_updated_policy(tmp_path, tp):
    from engine.distributed.process_group import free_port

    mp.spawn(_rank, args=(2, free_port(), str(tmp_path), tp), nprocs=2)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(results):
        assert result["rows"] == len(SHARES[rank][0])
        assert result["tensors"] > 0
        assert result["changed"], f"rank {rank}: the step did not change its greedy answers"
        assert result["equal_before"], f"rank {rank}: vLLM's first answers are not the policy's"
        assert result["equal"], f"rank {rank}: vLLM's greedy answers are not the policy's"


@pytest.mark.parametrize("tp", [1, 2], ids=["an-engine-per-rank", "one-engine-over-both"])
def test_the_ray_path_trains_with_vllm_on_its_ranks(tmp_path, tp):
    ray = pytest.importorskip("ray")
    from engine.config import load_config
    from engine.tiny import ensure_tiny_assets
    from engine.trainer.run import run_training
    from tests.engine.trainer.test_trainer import ListRecorder

    assets = ensure_tiny_assets()
    config = load_config(
        "grpo_tiny",
        overrides=[
            f"actor_rollout_ref.model.path={assets.model_dir}",
            "trainer.controller=ray",
            "trainer.n_gpus_per_node=2",
            *short_run(tmp_path, steps=2),
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.name=vllm",
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={KV_CACHE_BYTES}",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
        ],
    )
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        recorder = ListRecorder()
        assert run_training(config, recorder) == "succeeded"
    finally:
        ray.shutdown()
    assert [step for step, _ in recorder.steps] == [1, 2]
    for _, metrics in recorder.steps:
        assert metrics["training/rollout_probs_diff_max"] <= LOGP_ATOL


def _two_engines_rank(index: int, ports: list[int], out: str) -> None:
    """Rank ``index % 2`` of world ``index // 2``: two gloo worlds of two ranks on this machine,
    each one tensor-parallel vLLM engine over its ranks 0 and 1, started at the same time."""
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config import RolloutConfig
    from engine.config.rollout import EngineKwargsConfig
    from engine.distributed.process_group import init_process_group
    from engine.rollout.tensor_parallel import TensorParallelShare, tensor_parallel_group
    from engine.rollout.vllm_rollout import VLLMRollout
    from engine.tiny import ensure_tiny_assets
    from tests.engine.distributed.helpers import prompt_batch
    from tests.engine.rollout.test_vllm_engine import greedy_of

    world, rank = divmod(index, 2)
    init_process_group(rank=rank, world_size=2, host="127.0.0.1", port=ports[world], backend="gloo")
    path = str(ensure_tiny_assets().model_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = RolloutConfig(
        name="vllm",
        dtype="float32",
        max_model_len=64,
        tensor_model_parallel_size=2,
        engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": KV_CACHE_BYTES}),
    )
    group = tensor_parallel_group(2, "actor_rollout_ref.rollout.tensor_model_parallel_size")
    assert group is not None
    rollout = TensorParallelShare(VLLMRollout(path, tokenizer, config, seed=world), group)
    batch = prompt_batch(tokenizer, SHARES[rank][0])
    greedy = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}
    responses = rollout.generate_sequences(batch, max_new_tokens=NEW_TOKENS, sampling=greedy)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = greedy_of(model, tokenizer, batch, max_new_tokens=NEW_TOKENS)
    equal = same_answers(responses, expected, tokenizer.pad_token_id)
    Path(out, f"world{world}-rank{rank}.json").write_text(json.dumps({"equal": equal}))
    dist.barrier()
    dist.destroy_process_group()


def test_two_tensor_parallel_engines_over_the_same_ranks_start_side_by_side(tmp_path):
    """Two runs on one machine, each with one engine over its ranks 0 and 1: vLLM's CPU build
    names the group's shared memory after the ranks alone, so the two starts take turns."""
    from engine.distributed.process_group import free_port

    mp.spawn(_two_engines_rank, args=([free_port(), free_port()], str(tmp_path)), nprocs=4)
    for world in (0, 1):
        for rank in (0, 1):
            result = json.loads((tmp_path / f"world{world}-rank{rank}.json").read_text())
            assert result["equal"], f"world {world} rank {rank}: not the policy's greedy answers"
