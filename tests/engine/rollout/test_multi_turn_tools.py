"""Tool calling in the multi-turn rollout (verl's hermes format), on the tiny tokenizer.

The wrapped rollout engine is scripted: each assistant turn's text is chosen from the
conversation so far, which pins exactly which tokens are the policy's and which the tools'.
The HF rollout with a real policy and the calculator runs in ``test_calculator_learning``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.config import RolloutConfig
from engine.data import DataProto
from engine.roles.actor_rollout_ref import get_rollout
from engine.rollout.multi_turn import MultiTurnRollout
from engine.tools import Tool, load_tools
from engine.tools.calculator import CalculatorTool
from engine.tools.tiny_task import TOOLS_YAML, tool_call_text
from engine.tools.tool_task import tool_tokenizer
from engine.trainer.metrics import compute_data_metrics
from tests.engine.rollout.contract import chat_prompts

CALL = tool_call_text("123+456=")  # <tool_call>{"name": "calc", "arguments": {"expr": ...}}
SCHEMA = {"type": "function", "function": {"name": "calc"}}
LOGP = -0.25


class ScriptedRollout:
    """A rollout engine whose next assistant turn is ``script(context_text)``."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script

    def generate_sequences(self, prompts, *, max_new_tokens, sampling, generator=None):
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        rows = []
        for i in range(len(ids)):
            context = self.tokenizer.decode(ids[i][mask[i].bool()].tolist())
            text = self.script(context)
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            rows.append(tokens + [self.tokenizer.eos_token_id])
        width = max(len(r) for r in rows)
        responses = torch.zeros((len(rows), width), dtype=torch.long)
        response_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            responses[i, : len(row)] = torch.tensor(row)
            response_mask[i, : len(row)] = 1
        return DataProto.from_dict(
            {
                "responses": responses,
                "response_mask": response_mask,
                "rollout_log_probs": response_mask.float() * LOGP,
            },
            {"truncated": np.zeros(len(rows), dtype=bool)},
        )


def call_then_answer(context: str) -> str:
    """Call the calculator once, then copy its answer."""
    if "</tool_response>" in context:
        return context.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0]
    return CALL


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


@pytest.fixture
def tools(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    return load_tools(path)


def config(**overrides) -> SimpleNamespace:
    base = {
        "enable": True,
        "max_assistant_turns": None,
        "max_user_turns": None,
        "interaction_path": None,
        "interaction_name": None,
        "tool_config_path": None,
        "format": "hermes",
        "max_parallel_calls": 1,
        "max_tool_response_length": 256,
        "tool_response_truncate_side": "middle",
    }
    return SimpleNamespace(**{**base, **overrides})


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def generate(rollout, tokenizer, questions, budget=400):
    return rollout.generate_sequences(
        chat_prompts(tokenizer, questions), max_new_tokens=budget, sampling={}
    )


def test_tool_answers_are_in_the_sequence_but_masked_out_of_the_loss(tokenizer, tools):
    # multi_turn.tool_config_path: the calculator answers the call; its tokens get mask 0.
    script = ScriptedRollout(tokenizer, call_then_answer)
    out = generate(MultiTurnRollout(script, tokenizer, config(), tools=tools), tokenizer, ["q"])
    call = ids(tokenizer, CALL + "<eos>")
    tool = ids(tokenizer, "<|user|><tool_response>579</tool_response><|assistant|>")
    answer = ids(tokenizer, "579<eos>")
    b = out.batch
    assert b["responses"][0].tolist() == call + tool + answer
    assert b["response_mask"][0].tolist() == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    assert b["attention_mask"][0, -len(call + tool + answer) :].tolist() == [1] * len(
        call + tool + answer
    )
    expected_logp = [LOGP] * len(call) + [0.0] * len(tool) + [LOGP] * len(answer)
    assert b["rollout_log_probs"][0].tolist() == expected_logp
    nt = out.non_tensor_batch
    assert nt["num_turns"].tolist() == [2]
    assert nt["tool_call_counts"].tolist() == [1]
    assert nt["tool_error_counts"].tolist() == [0]
    assert nt["messages"][0][-2:] == [
        {"role": "tool", "content": "579"},
        {"role": "assistant", "content": "579"},
    ]
    turns = nt["turns"][0]
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant"]
    assert turns[0]["tool_calls"] == [{"name": "calc", "arguments": {"expr": "123+456"}}]
    assert turns[1]["content"] == "579" and turns[1]["error"] is None


def test_without_a_call_the_conversation_ends_and_with_one_it_goes_on(tokenizer, tools):
    direct = ScriptedRollout(tokenizer, lambda context: "580" if "1=" in context else CALL)
    rollout = MultiTurnRollout(direct, tokenizer, config(max_assistant_turns=3), tools=tools)
    out = generate(rollout, tokenizer, ["1=", "2="], budget=400)
    # Row 1 calls every turn, so max_assistant_turns ends it after its third assistant turn.
    assert out.non_tensor_batch["num_turns"].tolist() == [1, 3]
    assert out.non_tensor_batch["tool_call_counts"].tolist() == [0, 2]


def test_max_parallel_calls_runs_that_many_and_drops_the_rest(tokenizer, tools):
    two = tool_call_text("1+1=") + tool_call_text("2+2=") + tool_call_text("3+3=")
    script = ScriptedRollout(tokenizer, lambda c: "ok" if "tool_response" in c else two)
    for parallel, answers in ((1, ["2"]), (2, ["2", "4"])):
        rollout = MultiTurnRollout(
            script, tokenizer, config(max_parallel_calls=parallel), tools=tools
        )
        out = generate(rollout, tokenizer, ["q"])
        tool_messages = [m for m in out.non_tensor_batch["messages"][0] if m["role"] == "tool"]
        assert [m["content"] for m in tool_messages] == answers
        assert out.non_tensor_batch["tool_call_counts"].tolist() == [parallel]
        # Both answers land in one tool turn, rendered by the template in order.
        rendered = "".join(f"<|user|><tool_response>{a}</tool_response>" for a in answers)
        mask = out.batch["response_mask"][0].bool()
        text = tokenizer.decode(out.batch["responses"][0][~mask & (out.batch["responses"][0] > 0)])
        assert text == rendered + "<|assistant|>"


@pytest.mark.parametrize(
    ("side", "shown"),
    [
        ("left", "1000...(truncated)"),
        ("right", "(truncated)...0000"),
        ("middle", "10...(truncated)...00"),
    ],
)
def test_long_tool_answers_are_cut_to_max_tool_response_length(tokenizer, tools, side, shown):
    # multi_turn.max_tool_response_length and tool_response_truncate_side: 10**20 has 21 digits.
    huge = '<tool_call>{"name": "calc", "arguments": {"expr": "10**20"}}</tool_call>'
    script = ScriptedRollout(tokenizer, lambda c: "ok" if "tool_response" in c else huge)
    cfg = config(max_tool_response_length=4, tool_response_truncate_side=side)
    out = generate(MultiTurnRollout(script, tokenizer, cfg, tools=tools), tokenizer, ["q"])
    assert out.non_tensor_batch["messages"][0][2] == {"role": "tool", "content": shown}


class Broken(Tool):
    def execute(self, arguments, extra_info):
        raise RuntimeError("no backend")


def test_a_failing_tool_is_a_recorded_error_and_the_run_goes_on(tokenizer):
    tools = {"calc": Broken({}, SCHEMA)}
    script = ScriptedRollout(tokenizer, lambda c: "sorry" if "tool_response" in c else CALL)
    out = generate(MultiTurnRollout(script, tokenizer, config(), tools=tools), tokenizer, ["q"])
    nt = out.non_tensor_batch
    assert nt["tool_error_counts"].tolist() == [1]
    assert nt["messages"][0][2] == {"role": "tool", "content": "Error: RuntimeError: no backend"}
    assert nt["turns"][0][1]["error"] == "RuntimeError: no backend"
    assert nt["turns"][0][2] == {"role": "assistant", "content": "sorry"}


def test_tool_turns_count_against_max_user_turns(tokenizer, tools):
    script = ScriptedRollout(tokenizer, lambda c: CALL)
    rollout = MultiTurnRollout(script, tokenizer, config(max_user_turns=2), tools=tools)
    out = generate(rollout, tokenizer, ["q"], budget=400)
    assert out.non_tensor_batch["num_turns"].tolist() == [3]
    assert out.non_tensor_batch["tool_call_counts"].tolist() == [2]


def test_turns_without_a_call_go_to_the_interaction(tokenizer, tools):
    def interaction(messages, extra_info):
        return {"role": "user", "content": "again"} if len(messages) < 4 else None

    script = ScriptedRollout(tokenizer, lambda c: "7")
    rollout = MultiTurnRollout(script, tokenizer, config(), tools=tools, interaction=interaction)
    out = generate(rollout, tokenizer, ["q"])
    assert [m["role"] for m in out.non_tensor_batch["messages"][0]] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert out.non_tensor_batch["tool_call_counts"].tolist() == [0]


def test_another_tool_call_format_is_refused(tokenizer):
    # multi_turn.format: only hermes is parsed.
    with pytest.raises(ValueError, match="format='gpt-oss' is not supported; use hermes"):
        MultiTurnRollout(
            None, tokenizer, config(format="gpt-oss"), tools={"calc": Broken({}, SCHEMA)}
        )


def test_the_config_key_alone_turns_tool_calling_on(tmp_path, tokenizer):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    rollout_config = RolloutConfig()
    rollout_config.multi_turn.enable = True
    rollout_config.multi_turn.tool_config_path = str(path)
    rollout = get_rollout("hf", torch.nn.Linear(1, 1), tokenizer, rollout_config)
    assert isinstance(rollout, MultiTurnRollout)
    assert isinstance(rollout.tools["calc"], CalculatorTool)
    assert rollout.interactions is None


def test_turn_and_tool_call_counts_become_verl_metrics(tokenizer, tools):
    script = ScriptedRollout(
        tokenizer, lambda c: "1" if "2=" in c or "tool_response" in c else CALL
    )
    out = generate(
        MultiTurnRollout(script, tokenizer, config(), tools=tools), tokenizer, ["1=", "2="]
    )
    b = out.batch
    scores = torch.zeros_like(b["rollout_log_probs"])
    for key in ("token_level_scores", "token_level_rewards", "advantages", "returns"):
        b[key] = scores
    metrics = compute_data_metrics(out, use_critic=False, max_response_length=200)
    assert (metrics["num_turns/min"], metrics["num_turns/max"], metrics["num_turns/mean"]) == (
        1.0,
        2.0,
        1.5,
    )
    assert metrics["tool_call_counts/max"] == 1.0
    assert metrics["tool_call_counts/mean"] == 0.5
    assert metrics["tool_error_counts/mean"] == 0.0


def test_the_tool_keys_are_checked_when_the_config_is(tmp_path):
    from engine.config import load_config
    from engine.config.fields import ConfigValidationError
    from engine.config.validate import validate_config

    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    mt = "actor_rollout_ref.rollout.multi_turn"
    ok = [f"{mt}.enable=true", f"{mt}.tool_config_path={path}"]
    validate_config(load_config("grpo_tiny.yaml", ok), check_files=True)
    validate_config(load_config("grpo_tiny.yaml", [*ok, f"data.tool_config_path={path}"]))
    cases = [
        (f"{mt}.tool_config_path={tmp_path / 'missing.yaml'}", f"{mt}.tool_config_path"),
        (f"data.tool_config_path={tmp_path / 'other.yaml'}", "data.tool_config_path"),
        (f"{mt}.format=gpt-oss", "format"),
        (f"{mt}.tool_response_truncate_side=top", "tool_response_truncate_side"),
        (f"{mt}.max_parallel_calls=0", "max_parallel_calls"),
    ]
    for override, key in cases:
        with pytest.raises(ConfigValidationError, match=key):
            validate_config(load_config("grpo_tiny.yaml", [*ok, override]), check_files=True)
