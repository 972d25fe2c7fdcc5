"""The padding-free forward (``use_remove_padding``) equals the padded one; sequences stay apart.

A tiny fp32 Qwen2 policy and value model on a batch with left-padded prompts and right-padded
responses of lengths 1 to 6: log-probs, entropy, values and gradients equal the padded path
within 1e-5, through the lean runner and through the model's own forward (transformers' packed
sequences), with row and token-budget micro-batches. Changing one packed sequence leaves every
other sequence's outputs bit for bit unchanged: no attention crosses a boundary. The same holds
where rows repeat a prompt (GRPO's groups), which the lean runner packs once per distinct prompt.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.config.fields import ConfigValidationError
from engine.config.validate import validate_config
from engine.roles import packing
from engine.roles.actor import PolicyActor, response_logits
from engine.roles.critic import ValueCritic, response_values
from engine.roles.packing import (
    PrefixAttention,
    VarlenAttention,
    pack,
    packed_response_logits,
    packed_response_values,
)
from tests.engine.distributed.helpers import tiny_config, tiny_policy
from tests.engine.roles.test_dynamic_bsz import (
    LENGTHS,
    VOCAB,
    actor_config,
    max_diff,
    minus,
    policy_batch,
    value_model,
    weights,
)

TOL = 1e-5


def padded_batch():
    """Return ``policy_batch`` in fp32 with prompts left-padded by 0 to 3 tokens."""
    data = policy_batch()
    b = data.batch
    for key in ("advantages", "old_log_probs", "ref_log_prob", "returns", "values"):
        b[key] = b[key].float()
    for row, pad in enumerate([2, 0, 3, 1, 0, 2, 1]):
        b["attention_mask"][row, :pad] = 0
        b["input_ids"][row, :pad] = 0
    b["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return data


GROUPS = [[0, 1, 2], [3, 4], [5, 6]]  # rows that share a prompt in ``grouped_batch``


def grouped_batch():
    """Return ``padded_batch`` with each group of ``GROUPS`` repeating its first row's prompt,
    as GRPO's n samples of one prompt do (prompts of 2, 3 and 2 real tokens)."""
    data = padded_batch()
    b = data.batch
    prompt = b["input_ids"].shape[1] - b["responses"].shape[1]
    for rows in GROUPS:
        for row in rows[1:]:
            b["input_ids"][row, :prompt] = b["input_ids"][rows[0], :prompt]
            b["attention_mask"][row, :prompt] = b["attention_mask"][rows[0], :prompt]
    b["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return data


def shared_calls(monkeypatch) -> list[int]:
    """Record the distinct prompts of each shared-prompt packed forward."""
    calls: list[int] = []
    original = packing._shared_prompt_forward

    def spy(runner, batch, groups):
        calls.append(len(groups[0]))
        return original(runner, batch, groups)

    monkeypatch.setattr(packing, "_shared_prompt_forward", spy)
    return calls


def test_pack_keeps_the_real_tokens_with_restarting_positions():
    batch = padded_batch().batch
    packed = pack(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    seqlens = [4 - pad + n for pad, n in zip([2, 0, 3, 1, 0, 2, 1], LENGTHS, strict=True)]
    assert packed.seqlens.tolist() == seqlens
    assert packed.input_ids.shape == (1, sum(seqlens))
    assert packed.cu_seqlens.tolist() == [0, *torch.tensor(seqlens).cumsum(0).tolist()]
    starts = packed.cu_seqlens[:-1].long()
    assert packed.position_ids[0, starts].tolist() == [0] * 7  # every sequence starts at 0
    expected = torch.cat([torch.arange(n) for n in seqlens])
    assert torch.equal(packed.position_ids[0], expected)
    keep = batch["attention_mask"].bool()
    assert torch.equal(packed.input_ids[0], batch["input_ids"][keep])


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "module"])
def test_logits_equal_the_padded_path(lean):
    batch = padded_batch().batch
    model = tiny_policy(VOCAB, seed=1).eval()
    mask = batch["response_mask"].bool()
    padded = response_logits(model, batch, 0.7, lean=lean)
    packed = packed_response_logits(model, batch, 0.7, lean=lean)
    assert packed.shape == padded.shape and packed.dtype == torch.float32
    torch.testing.assert_close(packed[mask], padded[mask], atol=TOL, rtol=0)
    assert packed[~mask].abs().max() == 0  # no prediction where no response token is


@pytest.mark.parametrize("budget", [None, 20], ids=["rows", "token-budget"])
def test_log_probs_and_entropy_equal_the_padded_path(budget):
    data = padded_batch()
    model = tiny_policy(VOCAB, seed=1)
    mask = data.batch["response_mask"].bool()
    runs = []
    for remove_padding in (False, True):
        actor = PolicyActor(model, actor_config("token-mean"), remove_padding=remove_padding)
        runs.append(
            actor.compute_log_prob(
                data, micro_batch_size=3, temperature=0.7, with_entropy=True, max_token_len=budget
            )
        )
    for padded, packed in zip(*runs, strict=True):
        assert packed.dtype == torch.float32
        torch.testing.assert_close(packed[mask], padded[mask], atol=TOL, rtol=0)


@pytest.mark.parametrize("shared", [False, True], ids=["distinct-prompts", "shared-prompts"])
@pytest.mark.parametrize(
    ("mode", "rows", "budget"),
    [("token-mean", 7, None), ("seq-mean-token-sum", 3, None), ("token-mean", 7, 20)],
)
def test_the_policy_gradient_equals_the_padded_path(monkeypatch, mode, rows, budget, shared):
    data = grouped_batch() if shared else padded_batch()
    base = tiny_policy(VOCAB, seed=1)
    calls = shared_calls(monkeypatch)
    grads, losses = [], []
    for remove_padding in (False, True):
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=1)
        actor = PolicyActor(model, actor_config(mode), optimizer, remove_padding=remove_padding)
        before = weights(model)
        metrics = actor.update_policy(
            data, mini_batch_size=7, micro_batch_size=rows, temperature=1.0, max_token_len=budget
        )
        grads.append(minus(before, model.state_dict()))
        losses.append([metrics[k] for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy")])
    assert bool(calls) == shared  # a micro-batch that repeats a prompt packs it once
    assert max(g.abs().max().item() for g in grads[0].values()) > 1e-3  # a real gradient
    assert max_diff(grads[1], grads[0]) < TOL
    assert losses[1] == pytest.approx(losses[0], abs=TOL)


def test_values_and_the_value_gradient_equal_the_padded_path():
    data = padded_batch()
    mask = data.batch["response_mask"].bool()
    model = value_model().float().eval()
    padded = response_values(model, data.batch)
    packed = packed_response_values(model, data.batch)
    torch.testing.assert_close(packed[mask], padded[mask], atol=TOL, rtol=0)
    cfg = copy.deepcopy(tiny_config().critic)
    cfg.ppo_epochs, cfg.grad_clip = 1, 1e9
    grads, values = [], []
    for remove_padding in (False, True):
        critic_model = value_model().float()
        critic = ValueCritic(
            critic_model,
            cfg,
            torch.optim.SGD(critic_model.parameters(), lr=1),
            remove_padding=remove_padding,
        )
        values.append(critic.compute_values(data, micro_batch_size=3, max_token_len=20))
        before = weights(critic_model)
        critic.update_critic(data, mini_batch_size=7, micro_batch_size=3)
        grads.append(minus(before, critic_model.state_dict()))
    torch.testing.assert_close(values[1], values[0], atol=TOL, rtol=0)
    assert max(g.abs().max().item() for g in grads[0].values()) > 1e-3
    assert max_diff(grads[1], grads[0]) < TOL


@pytest.mark.parametrize("forward", ["lean", "module", "values"])
def test_no_attention_crosses_a_sequence_boundary(forward):
    """Other tokens in row 3 (same length): rows 0-2 and 4-6 are bit for bit the same."""
    batch = padded_batch().batch
    changed = {key: value.clone() for key, value in batch.items()}
    keep = changed["attention_mask"][3].bool()
    changed["input_ids"][3, keep] = (changed["input_ids"][3, keep] + 5) % VOCAB
    changed["responses"][3] = changed["input_ids"][3, -changed["responses"].shape[1] :]
    if forward == "values":
        model = value_model().float().eval()
        run = lambda b: packed_response_values(model, b)  # noqa: E731
    else:
        model = tiny_policy(VOCAB, seed=1).eval()
        run = lambda b: packed_response_logits(model, b, lean=forward == "lean")  # noqa: E731
    before, after = run(batch), run(changed)
    others = [0, 1, 2, 4, 5, 6]
    assert torch.equal(before[others], after[others])
    assert not torch.equal(before[3], after[3])  # the changed sequence did change


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompts_are_packed_once_and_the_logits_equal_the_padded_path(
    monkeypatch, temperature
):
    batch = grouped_batch().batch
    model = tiny_policy(VOCAB, seed=1).eval()
    mask = batch["response_mask"].bool()
    calls = shared_calls(monkeypatch)
    packed = packed_response_logits(model, batch, temperature)
    assert calls == [3]  # one packed forward over the 3 distinct prompts
    padded = response_logits(model, batch, temperature)
    torch.testing.assert_close(packed[mask], padded[mask], atol=TOL, rtol=0)
    assert packed[~mask].abs().max() == 0
    unshared = packed_response_logits(model, batch, temperature, lean=False)  # every prompt
    torch.testing.assert_close(packed[mask], unshared[mask], atol=TOL, rtol=0)


def test_no_attention_crosses_a_sequence_boundary_between_rows_sharing_a_prompt(monkeypatch):
    """Other response tokens in row 4: every other row, row 3 of its group included, is bit for
    bit the same; another prompt for group 0 changes its three rows and no other."""
    batch = grouped_batch().batch
    model = tiny_policy(VOCAB, seed=1).eval()
    calls = shared_calls(monkeypatch)
    before = packed_response_logits(model, batch)
    response = {key: value.clone() for key, value in batch.items()}
    n = int(response["response_mask"][4].sum())
    response["responses"][4, :n] = (response["responses"][4, :n] + 5) % VOCAB
    response["input_ids"][4, -response["responses"].shape[1] :] = response["responses"][4]
    after = packed_response_logits(model, response)
    others = [0, 1, 2, 3, 5, 6]
    assert torch.equal(before[others], after[others])
    assert not torch.equal(before[4], after[4])
    prompt = {key: value.clone() for key, value in batch.items()}
    width = prompt["input_ids"].shape[1] - prompt["responses"].shape[1]
    for row in GROUPS[0]:
        keep = prompt["attention_mask"][row, :width].bool()
        prompt["input_ids"][row, :width][keep] = (
            prompt["input_ids"][row, :width][keep] + 7
        ) % VOCAB
    after = packed_response_logits(model, prompt)
    assert torch.equal(before[3:], after[3:])
    assert all(not torch.equal(before[row], after[row]) for row in GROUPS[0])
    assert calls == [3, 3, 3]


def test_prefix_attention_sees_the_whole_prompt_and_the_earlier_tokens_of_its_response():
    """Hand check as for VarlenAttention: prompts of 2 and 1 keys, responses of 2, 1 and 2
    tokens on prompts 0, 0 and 1; the output rows are the attention weights over the 2 + 1
    prompt keys then the 5 response keys."""
    prompt_cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    seqlens = torch.tensor([2, 1, 2])
    cu = torch.tensor([0, 2, 3, 5], dtype=torch.int32)
    attend = PrefixAttention(prompt_cu, torch.tensor([0, 0, 1]), seqlens, cu)
    q = torch.zeros(1, 1, 5, 2)
    k = torch.zeros(1, 1, 8, 2)  # equal scores: uniform weights over the allowed keys
    v = torch.eye(8)[None, None]
    out = attend(q, k, v, 1.0)[0, 0]  # (5, 8)
    expected = torch.tensor(
        [
            [1 / 3, 1 / 3, 0, 1 / 3, 0, 0, 0, 0],
            [1 / 4, 1 / 4, 0, 1 / 4, 1 / 4, 0, 0, 0],
            [1 / 3, 1 / 3, 0, 0, 0, 1 / 3, 0, 0],
            [0, 0, 1 / 2, 0, 0, 0, 1 / 2, 0],
            [0, 0, 1 / 3, 0, 0, 0, 1 / 3, 1 / 3],
        ]
    )
    torch.testing.assert_close(out, expected)
    keys = attend.flash_keys.tolist()  # the flash-attn layout: each row's prompt, then itself
    assert keys == [0, 1, 3, 4, 0, 1, 5, 2, 6, 7]
    assert attend.flash_cu_keys.tolist() == [0, 4, 7, 10]


def reference_flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, softmax_scale, causal):
    """flash-attn's ``flash_attn_varlen_func`` contract on a CPU: (T, h, D) packed sequences cut
    by ``cu_q``/``cu_k``, causal aligned at the bottom right (the last query sees every key)."""
    assert causal
    out = torch.empty_like(q)
    for i in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        nq, nk = qs.stop - qs.start, ks.stop - ks.start
        assert nq <= max_q and nk <= max_k
        sees = torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)
        out[qs] = torch.nn.functional.scaled_dot_product_attention(
            q[qs].transpose(0, 1),
            k[ks].transpose(0, 1),
            v[ks].transpose(0, 1),
            attn_mask=sees,
            scale=softmax_scale,
            enable_gqa=True,
        ).transpose(0, 1)
    return out


def test_the_flash_attention_calls_lay_out_what_flash_attn_expects(monkeypatch):
    """Both attentions through a CPU stand-in for ``flash_attn_varlen_func`` (the real one is
    the gpu test's) equal their SDPA paths: the packed layout and boundaries are flash-attn's."""
    g = torch.Generator().manual_seed(0)
    seqlens = torch.tensor([3, 1, 7, 4])
    cu = torch.nn.functional.pad(seqlens.cumsum(0), (1, 0)).to(torch.int32)
    prompt_cu = torch.tensor([0, 5, 7], dtype=torch.int32)
    q = torch.randn(1, 4, int(seqlens.sum()), 8, generator=g)
    own_k, own_v = (torch.randn(1, 2, int(seqlens.sum()), 8, generator=g) for _ in range(2))
    prompt_k, prompt_v = (torch.randn(1, 2, 7, 8, generator=g) for _ in range(2))
    varlen = VarlenAttention(seqlens, cu)
    prefix = PrefixAttention(prompt_cu, torch.tensor([1, 0, 0, 1]), seqlens, cu)
    k, v = torch.cat([prompt_k, own_k], dim=2), torch.cat([prompt_v, own_v], dim=2)
    sdpa = varlen(q, own_k, own_v, 0.3), prefix(q, k, v, 0.3)
    monkeypatch.setattr(packing, "_flash_for", lambda q: reference_flash_varlen)
    flash = varlen(q, own_k, own_v, 0.3), prefix(q, k, v, 0.3)
    for a, b in zip(flash, sdpa, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_varlen_attention_sees_only_the_earlier_tokens_of_its_own_sequence():
    """Hand check: with one key per position and value = position one-hot, the output is the
    attention weights; they are zero outside the query's own sequence and its future."""
    seqlens = torch.tensor([2, 3])
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    q = torch.zeros(1, 1, 5, 2)
    k = torch.zeros(1, 1, 5, 2)  # equal scores: uniform weights over the allowed keys
    v = torch.eye(5)[None, None]  # (1, 1, 5, 5): output row = the weights over the 5 keys
    out = VarlenAttention(seqlens, cu)(q, k, v, 1.0)[0, 0]  # (5, 5)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1 / 2, 1 / 2, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1 / 2, 1 / 2, 0],
            [0, 0, 1 / 3, 1 / 3, 1 / 3],
        ]
    )
    torch.testing.assert_close(out, expected)


def test_varlen_attention_in_length_buckets_equals_attention_per_sequence():
    seqlens = torch.tensor([1, 40, 3, 38, 2, 41])
    attend = VarlenAttention(seqlens, torch.nn.functional.pad(seqlens.cumsum(0), (1, 0)))
    assert len(attend.groups) > 1  # short and long sequences run in separate SDPA calls
    g = torch.Generator().manual_seed(0)
    total = int(seqlens.sum())
    q, k, v = (torch.randn(1, heads, total, 8, generator=g) for heads in (4, 2, 2))
    out = attend(q, k, v, 0.3)
    start = 0
    for n in seqlens.tolist():
        one = slice(start, start + n)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, one], k[:, :, one], v[:, :, one], is_causal=True, scale=0.3, enable_gqa=True
        )
        torch.testing.assert_close(out[:, :, one], expected, atol=1e-6, rtol=0)
        start += n


@pytest.mark.parametrize("on", [True, False])
def test_the_workers_read_use_remove_padding(on):
    from engine.config.loader import load_config
    from engine.config.resolve import resolve_config
    from engine.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.roles.critic import CriticWorker

    config = tiny_config()
    config.actor_rollout_ref.model.use_remove_padding = on
    worker = ActorRolloutRefWorker(
        config, device=torch.device("cpu"), total_steps=1, need_ref=False
    )
    assert worker.actor.forward is (packed_response_logits if on else response_logits)
    config = resolve_config(load_config("ppo_tiny", [f"critic.model.use_remove_padding={on}"]))
    critic = CriticWorker(config, total_steps=1, device=torch.device("cpu")).critic
    assert critic.forward is (packed_response_values if on else response_values)


def test_actor_use_remove_padding_must_follow_the_model_key():
    def errors(config) -> dict[str, str]:
        try:
            validate_config(config, check_files=False)
        except ConfigValidationError as caught:
            return {e.key: str(e) for e in caught.errors}
        return {}

    config = tiny_config()  # other keys of it fail validation too: only these two matter here
    key = "actor_rollout_ref.actor.use_remove_padding"
    config.actor_rollout_ref.actor.use_remove_padding = True  # model key left False
    assert "set actor_rollout_ref.model.use_remove_padding" in errors(config)[key]
    config.actor_rollout_ref.model.use_remove_padding = True
    config.critic.model.use_remove_padding = True
    found = errors(config)
    assert key not in found and "actor_rollout_ref.model.use_remove_padding" not in found
    assert "critic.model.use_remove_padding" not in found  # honoured now, not refused


@pytest.mark.gpu
def test_flash_attention_varlen_equals_the_sdpa_path_on_a_gpu():
    pytest.importorskip("flash_attn")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    seqlens = torch.tensor([5, 1, 37, 12], device="cuda")
    cu = torch.nn.functional.pad(seqlens.cumsum(0), (1, 0)).to(torch.int32)
    total = int(seqlens.sum())
    q = torch.randn(1, 8, total, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, total, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, total, 64, device="cuda", dtype=torch.bfloat16)
    attend = VarlenAttention(seqlens, cu)
    flash = attend(q, k, v, 0.125)  # flash_attn_varlen_func
    sdpa = attend(q.float(), k.float(), v.float(), 0.125)  # the padded SDPA path
    torch.testing.assert_close(flash.float(), sdpa, atol=2e-2, rtol=2e-2)
    batch = padded_batch().batch
    model = tiny_policy(VOCAB, seed=1).cuda().to(torch.bfloat16).eval()
    cuda_batch = {key: value.cuda() for key, value in batch.items()}
    mask = cuda_batch["response_mask"].bool()
    torch.testing.assert_close(
        packed_response_logits(model, cuda_batch)[mask],
        response_logits(model, cuda_batch)[mask],
        atol=5e-2,
        rtol=5e-2,
    )
    grouped = {key: value.cuda() for key, value in grouped_batch().batch.items()}
    mask = grouped["response_mask"].bool()
    torch.testing.assert_close(  # shared prompts: PrefixAttention's flash_attn_varlen_func
        packed_response_logits(model, grouped)[mask],
        response_logits(model, grouped)[mask],
        atol=5e-2,
        rtol=5e-2,
    )


def test_a_gap_inside_a_row_is_refused_naming_the_key():
    batch = padded_batch().batch
    batch["attention_mask"][1, 2] = 0  # a hole inside row 1's prompt
    with pytest.raises(ValueError, match=r"gap inside a row.*model.use_remove_padding=False"):
        pack(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
