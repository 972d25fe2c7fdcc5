"""verl's multi-turn tokenisation keys on the tiny tokenizer: ``use_inference_chat_template`` and
``tokenization_sanity_check_mode``.

The wrapped engine is scripted (``ScriptedRollout``: each turn's text is chosen from the context
it is given), and a template in the manner of Qwen3's drops an earlier assistant turn's reasoning
(everything up to ``~``) when it renders the conversation again.
"""

from __future__ import annotations

import logging

import pytest

from engine.rollout.multi_turn import MultiTurnRollout, text_differences
from engine.tools.tool_task import TOOL_CHAT_TEMPLATE, tool_tokenizer
from tests.engine.rollout.contract import chat_prompts
from tests.engine.rollout.test_multi_turn_tools import ScriptedRollout, config, ids

BODY = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['role'] == 'assistant' %}{{ REASONED }}{{ eos_token }}{{ AFTER }}"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Renders an assistant turn without its reasoning, as Qwen3's template does with <think>.
DROPS_REASONING = BODY.replace("{{ REASONED }}", "{{ m['content'].split('~')[-1] }}").replace(
    "{{ AFTER }}", ""
)
# Puts a newline after each assistant turn's end token, as Qwen2.5's template does.
NEWLINE_AFTER_EOS = BODY.replace("{{ REASONED }}", "{{ m['content'] }}").replace(
    "{{ AFTER }}", "\n"
)
LOGGER = "engine.rollout.multi_turn"


def tokenizer_with(template: str):
    tokenizer = tool_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def once(messages, extra_info):
    """Answer the first assistant turn with "no", then end."""
    return {"role": "user", "content": "no"} if len(messages) < 3 else None


def run(tokenizer, seen=None, **overrides):
    def script(context: str) -> str:
        if seen is not None:
            seen.append(context)
        return "8" if "<|user|>no" in context else "think~7"

    rollout = MultiTurnRollout(
        ScriptedRollout(tokenizer, script), tokenizer, config(**overrides), interaction=once
    )
    return rollout.generate_sequences(
        chat_prompts(tokenizer, ["q"]), max_new_tokens=80, sampling={}
    )


@pytest.mark.parametrize("inference", [False, True])
def test_use_inference_chat_template_renders_the_next_prompt_but_trains_on_the_recorded_ids(
    inference,
):
    tokenizer = tokenizer_with(DROPS_REASONING)
    seen: list[str] = []
    out = run(tokenizer, seen, use_inference_chat_template=inference)
    first = "<bos><|user|>q<|assistant|>"
    earlier = "7" if inference else "think~7"  # the template drops "think~"; the ids keep it
    assert seen == [first, f"{first}{earlier}<eos><|user|>no<|assistant|>"]
    # Either way the sequence trained on holds what the policy generated, and only that is in
    # the loss.
    turn, user, answer = "think~7<eos>", "<|user|>no<|assistant|>", "8<eos>"
    assert out.batch["responses"][0].tolist() == ids(tokenizer, turn + user + answer)
    mask = [1] * len(ids(tokenizer, turn)) + [0] * len(ids(tokenizer, user))
    assert out.batch["response_mask"][0].tolist() == mask + [1] * len(ids(tokenizer, answer))


@pytest.mark.parametrize(
    ("template", "mode", "warns"),
    [
        (TOOL_CHAT_TEMPLATE, "strict", False),  # turn by turn equals one piece
        (NEWLINE_AFTER_EOS, "strict", True),
        (NEWLINE_AFTER_EOS, "ignore_strippable", False),  # only whitespace differs
        (NEWLINE_AFTER_EOS, "disable", False),
        (DROPS_REASONING, "ignore_strippable", True),  # text differs
        (DROPS_REASONING, "disable", False),
    ],
)
def test_tokenization_sanity_check_mode_warns_on_what_it_says(caplog, template, mode, warns):
    tokenizer = tokenizer_with(template)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(tokenizer, tokenization_sanity_check_mode=mode)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert bool(warnings) == warns, warnings
    if warns:
        [message] = warnings
        assert f"tokenization_sanity_check_mode={mode}: 1 of 1 conversations" in message


def test_the_warning_shows_where_the_renderings_differ(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(tokenizer_with(NEWLINE_AFTER_EOS))
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert "full '\\n' vs turn by turn ''" in record.getMessage()


def test_text_differences_lists_each_differing_piece():
    assert text_differences("ab\ncd\n", "abcd") == [("\n", ""), ("\n", "")]
    assert text_differences("x7y", "xthink~7y") == [("", "think~")]
    assert text_differences("same", "same") == []


def test_an_unknown_sanity_check_mode_is_refused():
    with pytest.raises(ValueError, match="tokenization_sanity_check_mode='loose'; use one of"):
        MultiTurnRollout(
            None, tool_tokenizer(), config(tokenization_sanity_check_mode="loose"), interaction=once
        )
