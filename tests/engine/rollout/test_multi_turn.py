"""Multi-turn rollout on a random small Qwen2 with the character tokenizer (CPU).

The model is steered by a stateless logit bias keyed on the *input* token (after
``<|assistant|>`` comes ``a``, after ``a`` comes ``b``, after ``b`` comes EOS), so every assistant
turn is exactly ``ab<eos>`` under greedy decoding, and a full forward pass over the finished
conversation sees the same biased distribution as generation did.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.config import RolloutConfig
from engine.data import DataProto
from engine.roles.actor_rollout_ref import get_rollout
from engine.rollout.hf import HFRollout
from engine.rollout.multi_turn import MultiTurnRollout, load_interaction, message_delta_ids
from engine.tiny.tokenizer import build_tokenizer
from tests.engine.distributed.helpers import tiny_policy
from tests.engine.rollout.contract import chat_prompts

GREEDY = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    model = tiny_policy(len(tokenizer), max_positions=256).eval()
    ids = tokenizer.convert_tokens_to_ids
    bias = torch.zeros(len(tokenizer), len(tokenizer))  # (V_in, V_out)
    bias[ids("<|assistant|>"), ids("a")] = 20.0
    bias[ids("a"), ids("b")] = 20.0
    bias[ids("b"), tokenizer.eos_token_id] = 20.0

    def steer(_module, _args, kwargs, output):
        logits = output.logits  # (bs, L, V): the last L input positions
        inputs = kwargs["input_ids"][:, -logits.shape[1] :]
        output.logits = logits + bias[inputs]
        return output

    model.register_forward_hook(steer, with_kwargs=True)
    return model


def multi_turn_config(**overrides) -> SimpleNamespace:
    base = {"enable": True, "max_assistant_turns": None, "max_user_turns": None}
    return SimpleNamespace(interaction_path=None, interaction_name=None, **{**base, **overrides})


def prompts(tokenizer, questions: list[str]) -> DataProto:
    ground_truths = [{"ground_truth": str(i)} for i in range(len(questions))]
    return chat_prompts(tokenizer, questions, reward_model=ground_truths)


def always_go(model, tokenizer, **limits) -> MultiTurnRollout:
    """Return the HF rollout in conversations whose user answers every turn with "go"."""
    always = lambda messages, extra: {"role": "user", "content": "go"}  # noqa: E731
    return MultiTurnRollout(
        HFRollout(model, tokenizer, None),
        tokenizer,
        multi_turn_config(**limits),
        interaction=always,
    )


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def full_forward_log_probs(model, out) -> torch.Tensor:
    b = out.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits.float()
    width = b["responses"].shape[1]
    logp = torch.log_softmax(logits[:, -width - 1 : -1], -1)
    return logp.gather(-1, b["responses"][..., None]).squeeze(-1)


def test_mask_covers_exactly_the_assistant_tokens_and_stop_on_none(model, tokenizer):
    seen = []

    def interaction(messages, extra_info):
        seen.append((len(messages), dict(extra_info)))
        # Row 0 gets one reply, row 1 two; then None ends each conversation.
        replies = 1 if extra_info["index"] == 0 else 2
        return {"role": "user", "content": "no"} if len(messages) < 2 * replies + 1 else None

    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, multi_turn_config(), interaction=interaction
    )
    out = rollout.generate_sequences(
        prompts(tokenizer, ["1+1=", "2+2="]), max_new_tokens=40, sampling=GREEDY
    )

    turn = ids_of(tokenizer, "ab<eos>")
    user = ids_of(tokenizer, "<|user|>no<|assistant|>")
    rows = [turn + user + turn, turn + user + turn + user + turn]
    a, u = [1] * len(turn), [0] * len(user)
    masks = [a + u + a, a + u + a + u + a]
    width = len(rows[1])
    b = out.batch
    prompt_len = b["prompts"].shape[1]
    assert b["responses"].shape == (2, width)
    for i, (row, mask) in enumerate(zip(rows, masks, strict=True)):
        pad = [0] * (width - len(row))
        assert b["responses"][i, : len(row)].tolist() == row
        assert b["response_mask"][i].tolist() == mask + pad
        # The context (attention) covers the interaction's tokens too; padding stays out.
        assert b["attention_mask"][i, prompt_len:].tolist() == [1] * len(row) + pad
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 3]
    assert out.non_tensor_batch["truncated"].tolist() == [False, False]
    assert out.non_tensor_batch["messages"][0] == [
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "ab"},
        {"role": "user", "content": "no"},
        {"role": "assistant", "content": "ab"},
    ]
    # The interaction saw the ground truth, and was asked once more per row before stopping.
    assert [n for n, _ in seen] == [2, 2, 4, 4, 6]
    # The rows' calls of one turn run at once, so either row may come first.
    assert {"index": 0, "ground_truth": "0"} in [info for _, info in seen[:2]]


def test_rollout_log_probs_match_a_full_forward_on_assistant_tokens_only(model, tokenizer):
    rollout = always_go(model, tokenizer, max_assistant_turns=3)
    out = rollout.generate_sequences(
        prompts(tokenizer, ["3+4=", "5="]), max_new_tokens=60, sampling=GREEDY
    )
    mask = out.batch["response_mask"]
    expected = full_forward_log_probs(model, out) * mask
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-5, rtol=1e-5)
    assert bool((out.batch["rollout_log_probs"][mask.bool()] < 0).all())


def test_max_assistant_turns_ends_on_an_assistant_turn(model, tokenizer):
    rollout = always_go(model, tokenizer, max_assistant_turns=2)
    out = rollout.generate_sequences(prompts(tokenizer, ["9="]), max_new_tokens=60, sampling=GREEDY)
    turn, user = ids_of(tokenizer, "ab<eos>"), ids_of(tokenizer, "<|user|>go<|assistant|>")
    assert out.batch["responses"][0].tolist() == turn + user + turn
    assert out.non_tensor_batch["num_turns"].tolist() == [2]
    roles = [m["role"] for m in out.non_tensor_batch["messages"][0]]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_max_user_turns_limits_the_interaction(model, tokenizer):
    rollout = always_go(model, tokenizer, max_user_turns=1)
    out = rollout.generate_sequences(prompts(tokenizer, ["9="]), max_new_tokens=60, sampling=GREEDY)
    assert out.non_tensor_batch["num_turns"].tolist() == [2]


def test_the_response_budget_truncates_the_conversation(model, tokenizer):
    rollout = always_go(model, tokenizer)
    out = rollout.generate_sequences(prompts(tokenizer, ["9="]), max_new_tokens=20, sampling=GREEDY)
    turn, user = ids_of(tokenizer, "ab<eos>"), ids_of(tokenizer, "<|user|>go<|assistant|>")
    assert out.batch["responses"][0].tolist() == ((turn + user) * 3)[:20]
    assert out.non_tensor_batch["truncated"].tolist() == [True]


def test_message_delta_ids_follow_the_chat_template(tokenizer):
    messages = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    delta = message_delta_ids(tokenizer, messages, {"role": "user", "content": "ok?"})
    assert tokenizer.decode(delta) == "<|user|>ok?<|assistant|>"


def test_a_bad_interaction_return_value_is_a_recorded_error_that_ends_the_conversation(
    model, tokenizer
):
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None),
        tokenizer,
        multi_turn_config(),
        interaction=lambda m, e: "go",
    )
    out = rollout.generate_sequences(prompts(tokenizer, ["9="]), max_new_tokens=20, sampling=GREEDY)
    nt = out.non_tensor_batch
    assert nt["num_turns"].tolist() == [1]
    assert out.batch["responses"][0].tolist()[:3] == ids_of(tokenizer, "ab<eos>")
    [error] = nt["interaction_errors"][0]
    assert error.startswith("interaction '<lambda>' failed: ValueError: the interaction must")
    assert "'role' and 'content' or None, got 'go'" in error
    assert nt["turns"][0][-1] == {"role": "user", "content": "", "error": error}


def test_prompts_without_raw_prompt_are_rejected(model, tokenizer):
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None),
        tokenizer,
        multi_turn_config(),
        interaction=lambda m, e: None,
    )
    batch = prompts(tokenizer, ["9="])
    batch.non_tensor_batch.pop("raw_prompt")
    with pytest.raises(KeyError, match="raw_prompt"):
        rollout.generate_sequences(batch, max_new_tokens=20, sampling=GREEDY)


def test_the_interaction_is_loaded_from_a_file_by_name(tmp_path, model, tokenizer):
    path = tmp_path / "interaction.py"
    path.write_text("def reply(messages, extra_info):\n    return None\n")
    config = RolloutConfig()
    config.multi_turn.enable = True
    config.multi_turn.interaction_path = str(path)
    config.multi_turn.interaction_name = "reply"
    rollout = get_rollout("hf", model, tokenizer, config)
    assert isinstance(rollout, MultiTurnRollout)
    out = rollout.generate_sequences(prompts(tokenizer, ["9="]), max_new_tokens=20, sampling=GREEDY)
    assert out.non_tensor_batch["num_turns"].tolist() == [1]


def test_interaction_loading_errors_name_the_key_and_the_fix(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="multi_turn.interaction_path"):
        load_interaction(tmp_path / "missing.py", "reply")
    path = tmp_path / "interaction.py"
    path.write_text("def other(messages, extra_info):\n    return None\n")
    with pytest.raises(AttributeError, match=r"no function 'reply'.*\['other'\].*interaction_name"):
        load_interaction(path, "reply")
    with pytest.raises(ValueError, match="interaction_path"):
        MultiTurnRollout(None, tokenizer, multi_turn_config())


def test_turns_are_rendered_with_data_apply_chat_template_kwargs(model):
    # data.apply_chat_template_kwargs: the template puts "~" before each assistant turn when
    # enable_thinking is passed, so the interaction's tokens carry it only then.
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{% if enable_thinking %}~{% endif %}<|assistant|>{% endif %}"
    )
    once = lambda messages, extra: (  # noqa: E731
        {"role": "user", "content": "no"} if len(messages) < 3 else None
    )
    rows = {}
    for kwargs in ({}, {"enable_thinking": True}):
        rollout = MultiTurnRollout(
            HFRollout(model, tokenizer, None),
            tokenizer,
            multi_turn_config(),
            interaction=once,
            chat_template_kwargs=kwargs,
        )
        out = rollout.generate_sequences(
            prompts(tokenizer, ["9="]), max_new_tokens=40, sampling=GREEDY
        )
        responses = out.batch["responses"][0]  # (R,)
        kept = out.batch["attention_mask"][0, -len(responses) :].bool()  # (R,) no padding
        rows[bool(kwargs)] = responses[kept].tolist()
    turn = ids_of(tokenizer, "ab<eos>")
    assert rows[False] == turn + ids_of(tokenizer, "<|user|>no<|assistant|>") + turn
    assert rows[True] == turn + ids_of(tokenizer, "<|user|>no~<|assistant|>") + turn
