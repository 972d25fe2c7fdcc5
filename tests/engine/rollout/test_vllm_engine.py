"""The ``vllm`` rollout against a real vLLM engine: vLLM's CPU build on the embedded tiny model.

One engine serves the module (its start is the expensive part); a test that loads other weights
into it puts the tiny model's back afterwards, through the same ``load_weights`` it tests. The
engine's own forward (``response_logits``) and sampler (``hf`` rollout) on the same weights are
the reference. Where vLLM is absent these tests skip, unless ``POSTTRAIN_REQUIRE_VLLM=1`` (set
by ``scripts/test.sh``, so CI cannot skip them silently).

Tolerance: both sides compute in fp32; vLLM's CPU kernels (its attention, fused norms) sum in
another order than torch's, which moved sampled-token log-probs by at most 6e-6 on this model.
``LOGP_ATOL`` = 1e-4 leaves a margin of more than ten, while every mistake the check is for moves
them by far more: log-probs at another temperature (0.7 against 1.0) differ by 0.1 and more,
unfiltered against top-k renormalised ones by the log of the kept mass.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil

import pytest
import torch

from bench.training.vllm_generate import prompt_batch
from engine.config import RolloutConfig
from engine.config.rollout import EngineKwargsConfig
from engine.data import DataProto
from engine.roles.actor import response_logits
from engine.rollout.hf import HFRollout
from engine.rollout.sampling import TOKEN_VERSIONS, filter_logits
from engine.rollout.served import bucket_megabytes
from engine.rollout.vllm_rollout import VLLMRollout
from tests.engine.rollout.contract import GREEDY
from tests.vllm_tests import NO_VLLM, VLLM_SKIPPED

if VLLM_SKIPPED:
    pytest.skip(NO_VLLM, allow_module_level=True)

LOGP_ATOL = 1e-4
KV_CACHE_BYTES = 64 * 1024**2  # enough for every test's batch; vLLM's CPU default is larger
MAX_MODEL_LEN = 128


def sampling(temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0, **extra) -> dict:
    return {
        "do_sample": True,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        **extra,
    }


def rollout_config(**overrides) -> RolloutConfig:
    engine_kwargs = EngineKwargsConfig(vllm={"kv_cache_memory_bytes": KV_CACHE_BYTES})
    config = RolloutConfig(
        name="vllm", dtype="float32", max_model_len=MAX_MODEL_LEN, engine_kwargs=engine_kwargs
    )
    return dataclasses.replace(config, **overrides)


@pytest.fixture(scope="module")
def engine(tiny_assets, tokenizer):
    return VLLMRollout(str(tiny_assets.model_dir), tokenizer, rollout_config(), seed=0)


@pytest.fixture
def rollout(engine, policy):
    """The module's engine; the tiny model's weights are loaded back when the test is done."""
    eos_ids = list(engine.eos_ids)
    yield engine
    engine.eos_ids = eos_ids
    engine.load_weights(policy)


def prompts(tokenizer, n: int = 1, count: int = 8) -> DataProto:
    """Return ``count`` validation problems as chat prompts, each repeated ``n`` times, padded."""
    return prompt_batch(tokenizer, count, n)


def engine_logits(model, out: DataProto, temperature: float) -> torch.Tensor:
    """Return the engine's own logits (bs, T, V) for ``out``'s responses, divided by temperature."""
    with torch.no_grad():
        return response_logits(model, out.batch, temperature)


def gathered(log_probs: torch.Tensor, out: DataProto) -> torch.Tensor:
    """Return the log-probs (N,) of ``out``'s real response tokens from (bs, T, V)."""
    tokens = log_probs.gather(-1, out.batch["responses"][..., None]).squeeze(-1)  # (bs, T)
    return tokens[out.batch["response_mask"].bool()]


def greedy_of(model, tokenizer, batch: DataProto, max_new_tokens: int = 16) -> torch.Tensor:
    """Return the engine's own greedy responses (bs, T) (the ``hf`` rollout's sampler)."""
    hf = HFRollout(model, tokenizer, rollout_config(name="hf"))
    return hf.generate_sequences(batch, max_new_tokens=max_new_tokens, sampling=GREEDY).batch[
        "responses"
    ]


# -- log-probs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_match_the_engines_forward_in_fp32(
    rollout, policy, tokenizer, temperature
):
    out = rollout.generate_sequences(
        prompts(tokenizer, n=4), max_new_tokens=16, sampling=sampling(temperature)
    )
    mask = out.batch["response_mask"].bool()
    assert mask.sum() > 32
    expected = gathered(engine_logits(policy, out, temperature).log_softmax(-1), out)
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][mask], expected, atol=LOGP_ATOL, rtol=0
    )
    # The same tokens at another temperature are far off: the check can tell.
    other = gathered(engine_logits(policy, out, 1.7 - temperature).log_softmax(-1), out)
    assert (out.batch["rollout_log_probs"][mask] - other).abs().max() > 100 * LOGP_ATOL


@pytest.mark.parametrize(
    "filtered", [{"top_k": 3}, {"top_p": 0.6}, {"top_k": 5, "top_p": 0.8}], ids=str
)
def test_top_k_and_top_p_sample_from_the_filtered_renormalised_distribution(
    rollout, policy, tokenizer, filtered
):
    params = sampling(0.8, **filtered)
    out = rollout.generate_sequences(prompts(tokenizer, n=4), max_new_tokens=12, sampling=params)
    logits = engine_logits(policy, out, 0.8)  # (bs, T, V)
    kept = filter_logits(
        logits.flatten(0, 1), top_k=params["top_k"], top_p=params["top_p"]
    ).view_as(logits)
    # Every sampled token is inside the filtered set ...
    assert torch.isfinite(gathered(kept, out)).all()
    # ... and its log-prob is the filtered distribution's (processed_logprobs), not the full one.
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][out.batch["response_mask"].bool()],
        gathered(kept.log_softmax(-1), out),
        atol=LOGP_ATOL,
        rtol=0,
    )


# -- sampling keys -------------------------------------------------------------------------------
def test_n_samples_of_a_prompt_are_drawn_independently(rollout, tokenizer):
    batch = prompts(tokenizer, n=8, count=4)
    out = rollout.generate_sequences(batch, max_new_tokens=8, sampling=sampling(1.0))
    responses = out.batch["responses"].view(4, 8, -1)  # (prompts, n, T)
    distinct = [len({tuple(r.tolist()) for r in group}) for group in responses]
    assert max(distinct) > 1, distinct
    assert torch.equal(out.batch["prompts"], batch.batch["input_ids"])


def test_greedy_decoding_equals_the_engines_greedy_token_for_token(rollout, policy, tokenizer):
    batch = prompts(tokenizer, count=16)
    out = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    assert torch.equal(out.batch["responses"], greedy_of(policy, tokenizer, batch))
    # do_sample=False wins over a temperature, as validation's val_kwargs ask.
    again = rollout.generate_sequences(
        batch, max_new_tokens=16, sampling={**sampling(1.0), "do_sample": False}
    )
    assert torch.equal(again.batch["responses"], out.batch["responses"])


def test_max_tokens_cuts_responses_and_ignore_eos_runs_to_it(rollout, tokenizer):
    batch = prompts(tokenizer, count=8)
    short = rollout.generate_sequences(batch, max_new_tokens=2, sampling=GREEDY)
    assert short.batch["responses"].shape[1] <= 2
    ended = (short.batch["responses"] == tokenizer.eos_token_id).any(-1)
    assert short.non_tensor_batch["truncated"].tolist() == (~ended).tolist()

    through = rollout.generate_sequences(
        batch, max_new_tokens=10, sampling={**GREEDY, "ignore_eos": True}
    )
    assert through.batch["responses"].shape[1] == 10
    assert through.batch["response_mask"].all()
    assert through.non_tensor_batch["truncated"].all()


def test_every_stop_token_ends_a_response_and_is_kept_in_its_mask(rollout, tokenizer):
    batch = prompts(tokenizer, count=8)
    free = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    # Stop at the first answer digit as well as at EOS (what a generation_config eos list does).
    first = int(free.batch["responses"][0, 0])
    rollout.eos_ids = sorted({tokenizer.eos_token_id, first})
    out = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    for row, free_row in zip(out.batch["responses"], free.batch["responses"], strict=True):
        stops = [i + 1 for i, t in enumerate(free_row.tolist()) if t in rollout.eos_ids]
        end = stops[0] if stops else len(free_row)
        assert row[:end].tolist() == free_row[:end].tolist()
        assert (row[end:] == tokenizer.pad_token_id).all()
    lengths = out.batch["response_mask"].sum(-1)
    assert (out.batch["responses"][0, : int(lengths[0])].tolist()) == [first]


def test_a_response_stops_where_prompt_and_response_reach_max_model_len(rollout, tokenizer):
    # What the multi-turn loop relies on: it asks every conversation for the room of the least
    # advanced one, and a longer context stops at the context length instead of failing.
    batch = prompts(tokenizer, count=4)
    out = rollout.generate_sequences(
        batch, max_new_tokens=200, sampling={**GREEDY, "ignore_eos": True}
    )
    lengths = batch.batch["attention_mask"].sum(-1) + out.batch["response_mask"].sum(-1)
    assert lengths.tolist() == [MAX_MODEL_LEN] * 4
    assert out.non_tensor_batch["truncated"].all()


def test_a_max_model_len_shorter_than_prompt_and_response_is_refused_before_the_engine_starts(
    tiny_assets, tokenizer
):
    config = rollout_config(prompt_length=100, response_length=40)  # 140 > MAX_MODEL_LEN
    with pytest.raises(ValueError, match=r"max_model_len=128 is shorter than prompt_length \+ "):
        VLLMRollout(str(tiny_assets.model_dir), tokenizer, config)


# -- weight sync ---------------------------------------------------------------------------------
def one_optimizer_step(model, batch: DataProto) -> None:
    """One AdamW step on the NLL of ``batch``'s responses (as an update would move the policy)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    logits = response_logits(model, batch.batch, 1.0, lean=False)  # (bs, T, V)
    mask = batch.batch["response_mask"].bool()
    loss = -gathered(logits.log_softmax(-1), batch).sum() / mask.sum()
    loss.backward()
    optimizer.step()
    model.eval()


def test_after_an_optimizer_step_the_synced_engine_decodes_as_the_new_policy(
    rollout, policy, tokenizer
):
    batch = prompts(tokenizer, count=16)
    before = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    model = copy.deepcopy(policy)
    sampled = rollout.generate_sequences(
        prompts(tokenizer, n=4), max_new_tokens=16, sampling=sampling(1.0)
    )
    one_optimizer_step(model, sampled)

    rollout.bucket_bytes = 256 * 1024  # q, k and v of a layer arrive in different buckets
    try:
        stats = rollout.load_weights(model)
    finally:
        rollout.bucket_bytes = bucket_megabytes(rollout_config()) * 1024**2
    assert stats["buckets"] > 4 and stats["tensors"] == len(model.state_dict())
    after = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    expected = greedy_of(model, tokenizer, batch)
    assert not torch.equal(before.batch["responses"], expected)  # the step changed the policy
    assert torch.equal(after.batch["responses"], expected)
    # Its sampled log-probs are the new policy's too.
    out = rollout.generate_sequences(
        prompts(tokenizer, n=2), max_new_tokens=12, sampling=sampling(1.0)
    )
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][out.batch["response_mask"].bool()],
        gathered(engine_logits(model, out, 1.0).log_softmax(-1), out),
        atol=LOGP_ATOL,
        rtol=0,
    )


def test_a_lora_policy_syncs_with_its_adapter_merged(rollout, policy, tokenizer):
    from types import SimpleNamespace

    from engine.lora import apply_lora

    model = apply_lora(
        copy.deepcopy(policy),
        SimpleNamespace(lora_rank=4, lora_alpha=8, target_modules="all-linear"),
    )
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    model.eval()
    batch = prompts(tokenizer, count=16)
    base = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    rollout.load_weights(model)
    out = rollout.generate_sequences(batch, max_new_tokens=16, sampling=GREEDY)
    expected = greedy_of(model, tokenizer, batch)
    assert not torch.equal(base.batch["responses"], expected)
    assert torch.equal(out.batch["responses"], expected)


# -- bad input -----------------------------------------------------------------------------------
def test_gpu_memory_utilization_on_a_cpu_is_refused_before_the_engine_starts(
    tiny_assets, tokenizer
):
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.9 sizes a GPU's KV cache.*"):
        VLLMRollout(
            str(tiny_assets.model_dir), tokenizer, rollout_config(gpu_memory_utilization=0.9)
        )


def test_an_engine_argument_naming_a_path_is_refused_before_the_engine_starts(
    tiny_assets, tokenizer
):
    kwargs = EngineKwargsConfig(vllm={"download_dir": "/srv", "seed": 3})
    with pytest.raises(ValueError) as caught:
        VLLMRollout(str(tiny_assets.model_dir), tokenizer, rollout_config(engine_kwargs=kwargs))
    message = str(caught.value)
    assert "rollout.engine_kwargs.vllm.download_dir='/srv': is not passed to vLLM" in message
    assert "rollout.engine_kwargs.vllm.seed=3: is set from trainer.seed" in message


def test_a_model_vllm_cannot_load_is_named_before_the_engine_starts(
    tiny_assets, tokenizer, tmp_path
):
    folder = tmp_path / "model"
    shutil.copytree(tiny_assets.model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["TinyNetForX"]}))
    with pytest.raises(ValueError, match=r"architecture TinyNetForX is not one vLLM supports.*=hf"):
        VLLMRollout(str(folder), tokenizer, rollout_config())


# -- the policy's model.override_config ----------------------------------------------------------
def test_the_engine_builds_its_model_with_the_policys_override_config(tiny_assets, tokenizer):
    """A ``rope_theta`` override changes every position's rotation: an engine that ignored it
    would sample from another model than the one whose log-probs the actor trains."""
    from transformers import AutoModelForCausalLM

    from engine.roles.model_loading import changed_config_attributes, model_config_of

    overrides = {"rope_theta": 37.0, "attn_implementation": "sdpa"}
    model_config = dataclasses.make_dataclass("ModelConfig", ["override_config"])(overrides)
    config = model_config_of(str(tiny_assets.model_dir), model_config, "model.override_config")
    overridden = AutoModelForCausalLM.from_pretrained(
        tiny_assets.model_dir, config=config, dtype=torch.float32
    ).eval()
    changed = changed_config_attributes(str(tiny_assets.model_dir), model_config, "override_config")
    # transformers 5 keeps rope_theta inside rope_parameters; the engine gets it there.
    assert changed == {"rope_parameters": {**config.rope_parameters, "rope_theta": 37.0}}
    engine = VLLMRollout(
        str(tiny_assets.model_dir), tokenizer, rollout_config(), seed=0, model_overrides=changed
    )
    assert engine.engine_arguments(None, 0, {})["hf_overrides"] == changed
    out = engine.generate_sequences(
        prompts(tokenizer, n=2), max_new_tokens=16, sampling=sampling(1.0)
    )
    mask = out.batch["response_mask"].bool()
    expected = gathered(engine_logits(overridden, out, 1.0).log_softmax(-1), out)
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][mask], expected, atol=LOGP_ATOL, rtol=0
    )
    # The folder's own rope_theta gives other log-probs: the override is what made them agree.
    plain = AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir, dtype=torch.float32).eval()
    unchanged = gathered(engine_logits(plain, out, 1.0).log_softmax(-1), out)
    assert (out.batch["rollout_log_probs"][mask] - unchanged).abs().max() > 100 * LOGP_ATOL


# -- partial rollout -----------------------------------------------------------------------------
@pytest.fixture
def small_blocks(tiny_assets, tokenizer):
    """An engine of its own with 32-token KV blocks (the CPU attention's smallest), so a prompt and the
    tokens sampled before a sync fill whole blocks, which the prefix cache would keep."""
    engine = VLLMRollout(
        str(tiny_assets.model_dir),
        tokenizer,
        rollout_config(),
        seed=0,
        engine_kwargs={"block_size": 32},
    )
    yield engine
    del engine


def test_a_partial_rollout_resumes_the_rows_still_writing_under_the_weights_synced_meanwhile(
    small_blocks, policy, tokenizer
):
    rollout = small_blocks
    batch = prompts(tokenizer, n=2)
    newer = copy.deepcopy(policy)
    one_optimizer_step(
        newer,
        rollout.generate_sequences(batch, max_new_tokens=16, sampling=sampling(1.0)),
    )
    steps = 0

    def interrupt() -> int | None:
        """After the 28th engine step, load the newer weights (a sync arriving mid-chunk)."""
        nonlocal steps
        steps += 1
        if steps != 28:
            return None
        rollout.load_weights(newer)
        return 4

    # The tiny model answers in a few tokens: every row writes to the limit, so each is still
    # writing at the sync.
    out = rollout.generate_sequences(
        batch,
        max_new_tokens=40,
        sampling=sampling(1.0, ignore_eos=True),
        version=3,
        interrupt=interrupt,
    )
    mask = out.batch["response_mask"].bool()
    assert mask.all()  # the resumed requests kept the rest of their token budget, no more
    versions = out.batch[TOKEN_VERSIONS]
    # Every row switched at the same step and went on under the new weights to its end.
    [switch] = {versions[row].tolist().index(4) for row in range(len(versions))}
    assert 24 <= switch <= 30  # prompt (8-9 tokens) and these fill a 32-token block
    assert (versions[:, :switch] == 3).all() and (versions[:, switch:] == 4).all()

    # Each token's log-prob is the policy's that sampled it: the old one's before the sync,
    # the new one's after, on the whole sequence (prompt and tokens so far prefilled again).
    logp = out.batch["rollout_log_probs"][mask]
    old = gathered(engine_logits(policy, out, 1.0).log_softmax(-1), out)
    new = gathered(engine_logits(newer, out, 1.0).log_softmax(-1), out)
    before, after = versions[mask] == 3, versions[mask] == 4
    torch.testing.assert_close(logp[before], old[before], atol=LOGP_ATOL, rtol=0)
    torch.testing.assert_close(logp[after], new[after], atol=LOGP_ATOL, rtol=0)
    assert (new[after] - old[after]).abs().max() > 100 * LOGP_ATOL  # the two policies differ
