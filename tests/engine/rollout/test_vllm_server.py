"""vLLM in server mode (``AsyncLLM``, vLLM's CPU build) on the embedded tiny model.

Many concurrent requests, as rollout workers send them, each answered exactly as the colocated
engine answers a batch (greedy: the engine's own greedy tokens; sampled: log-probs within the
fp32 tolerance of ``test_vllm_engine``), and weight updates that land while requests run: every
response comes from one policy version, and says which.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import pytest_asyncio
import torch

from engine.data import DataProto
from engine.rollout.hf import eos_token_ids
from tests.engine.rollout.contract import GREEDY
from tests.engine.rollout.test_vllm_engine import (
    LOGP_ATOL,
    engine_logits,
    gathered,
    greedy_of,
    one_optimizer_step,
    prompts,
    rollout_config,
    sampling,
)
from tests.vllm_tests import NO_VLLM, VLLM_SKIPPED

if VLLM_SKIPPED:
    pytest.skip(NO_VLLM, allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_assets, tokenizer, policy):
    from engine.rollout.vllm_server import VLLMServer

    server = await VLLMServer.launch(
        str(tiny_assets.model_dir),
        rollout_config(),
        eos_ids=eos_token_ids(tokenizer, policy),
        seed=0,
    )
    yield server
    server.shutdown()


def unpadded(batch: DataProto) -> list[list[int]]:
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def expected_greedy(model, tokenizer, batch: DataProto, max_new_tokens: int) -> list[list[int]]:
    """Return the engine's own greedy responses, each cut after its EOS."""
    responses = greedy_of(model, tokenizer, batch, max_new_tokens=max_new_tokens)
    out = []
    for row in responses.tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        out.append(row[:end])
    return out


async def test_concurrent_greedy_requests_get_the_engines_greedy_answers(server, policy, tokenizer):
    batch = prompts(tokenizer, count=16)
    answers = await asyncio.gather(
        *(server.generate(ids, GREEDY, max_new_tokens=16) for ids in unpadded(batch))
    )
    assert [a.token_ids for a in answers] == expected_greedy(policy, tokenizer, batch, 16)
    assert {a.version for a in answers} == {server.version}
    assert {a.finish_reason for a in answers} == {"stop"}


async def test_concurrent_sampled_requests_carry_the_policys_log_probs(server, policy, tokenizer):
    batch = prompts(tokenizer, n=4, count=4)
    answers = await asyncio.gather(
        *(server.generate(ids, sampling(0.9), max_new_tokens=12) for ids in unpadded(batch))
    )
    from engine.rollout.served import response_batch

    out = response_batch(
        batch,
        [a.token_ids for a in answers],
        [a.log_probs for a in answers],
        eos_ids=server.eos_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][out.batch["response_mask"].bool()],
        gathered(engine_logits(policy, out, 0.9).log_softmax(-1), out),
        atol=LOGP_ATOL,
        rtol=0,
    )


async def test_an_update_during_requests_stamps_each_response_with_the_version_that_made_it(
    server, policy, tokenizer
):
    batch = prompts(tokenizer, count=16)
    requests = unpadded(batch)
    model = copy.deepcopy(policy)
    one_optimizer_step(model, prompts_with_answers(tokenizer))
    start = server.version
    old = expected_greedy(policy, tokenizer, batch, 24)
    new = expected_greedy(model, tokenizer, batch, 24)
    assert old != new

    # Half the requests are running when the update starts; the other half arrive during it.
    first = [
        asyncio.create_task(server.generate(ids, GREEDY, max_new_tokens=24)) for ids in requests[:8]
    ]
    await asyncio.sleep(0)
    update = asyncio.create_task(server.update_weights(model))
    await asyncio.sleep(0)
    second = [
        asyncio.create_task(server.generate(ids, GREEDY, max_new_tokens=24)) for ids in requests[8:]
    ]
    sizes = await update
    answers = await asyncio.gather(*first, *second)
    try:
        assert sizes["version"] == server.version == start + 1
        for i, answer in enumerate(answers):
            assert answer.version in (start, start + 1)
            assert answer.token_ids == (old if answer.version == start else new)[i], i
        assert {a.version for a in answers[8:]} == {start + 1}
        after = await server.generate(requests[0], GREEDY, max_new_tokens=24)
        assert (after.version, after.token_ids) == (start + 1, new[0])
    finally:
        await server.update_weights(policy)  # the tiny model again, for the other tests


def prompts_with_answers(tokenizer) -> DataProto:
    """Return a batch whose responses are wrong answers, for a step that changes the policy."""
    batch = prompts(tokenizer, count=8)
    wrong = tokenizer(["1<eos>"] * 8, add_special_tokens=False, return_tensors="pt")["input_ids"]
    mask = torch.ones_like(wrong)
    attention = torch.cat([batch.batch["attention_mask"], mask], -1)
    return DataProto.from_dict(
        {
            "input_ids": torch.cat([batch.batch["input_ids"], wrong], -1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": wrong,
            "response_mask": mask,
        }
    )


async def test_a_response_stops_at_max_model_len_and_says_so(server):
    answer = await server.generate([1] * 10, {**GREEDY, "ignore_eos": True}, max_new_tokens=200)
    assert (len(answer.token_ids), answer.finish_reason) == (128 - 10, "length")
