"""Tool calling through the engine adapters: the multi-turn loop over ``vllm`` and ``sglang``.

``sglang`` drives the fake engine of its own tests (``FakeEngine`` behind a fake ``sglang``
module), scripted by the decoded context: call the calculator, then copy its answer. ``vllm``
drives a real vLLM engine (its CPU build here, in fp32; bf16 on a GPU) serving a small random
Qwen2 taught, by a few hundred supervised steps, to make that call and copy the answer.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import tests.engine.rollout.test_sglang_rollout as sglang_tests
from engine.config import RolloutConfig
from engine.rollout.multi_turn import MultiTurnRollout
from engine.rollout.sglang_rollout import SGLangRollout
from engine.rollout.vllm_rollout import VLLMRollout
from engine.tools import load_tools
from engine.tools.tiny_task import TOOLS_YAML
from engine.tools.tool_task import tool_tokenizer
from tests.engine.rollout.contract import GREEDY, chat_prompts, hf_response_log_probs, random_qwen2
from tests.engine.rollout.test_multi_turn_tools import CALL, call_then_answer, config
from tests.engine.rollout.test_sglang_rollout import fake_sglang  # noqa: F401  (a fixture)

LOGP = -0.5


class ByContext:
    """A fake engine's script: prompt ids -> ``call_then_answer`` of the decoded context."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.contexts: list[str] = []

    def __getitem__(self, prompt_ids: tuple[int, ...]) -> tuple[list[int], list[float]]:
        context = self.tokenizer.decode(list(prompt_ids))
        self.contexts.append(context)
        text = call_then_answer(context)
        tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        tokens.append(self.tokenizer.eos_token_id)
        return tokens, [LOGP] * len(tokens)


@pytest.fixture
def tools(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    return load_tools(path)


def sglang_adapter(tmp_path, tokenizer, script, monkeypatch):
    monkeypatch.setattr(sglang_tests, "SCRIPT", script)  # what FakeEngine.generate answers from
    config = RolloutConfig(name="sglang", enable_sleep_mode=False, dtype="float32")
    return SGLangRollout(str(tmp_path), tokenizer, config)


@pytest.mark.usefixtures("fake_sglang")
def test_tool_calls_through_the_sglang_adapter_are_masked_and_counted(tmp_path, tools, monkeypatch):
    tokenizer = tool_tokenizer()
    script = ByContext(tokenizer)
    engine = sglang_adapter(tmp_path, tokenizer, script, monkeypatch)
    rollout = MultiTurnRollout(engine, tokenizer, config(), tools=tools)
    # Row 0 calls the calculator; row 1's context already holds an answer, so it answers.
    out = rollout.generate_sequences(
        chat_prompts(tokenizer, ["123+456=", "<tool_response>9</tool_response>"]),
        max_new_tokens=200,
        sampling=GREEDY,
    )

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    call = ids(CALL + "<eos>")
    tool = ids("<|user|><tool_response>579</tool_response><|assistant|>")
    answer = ids("579<eos>")
    b, nt = out.batch, out.non_tensor_batch
    row = call + tool + answer
    assert b["responses"][0, : len(row)].tolist() == row
    assert b["response_mask"][0].tolist() == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    expected_logp = [LOGP] * len(call) + [0.0] * len(tool) + [LOGP] * len(answer)
    assert b["rollout_log_probs"][0].tolist() == expected_logp
    direct = ids("9<eos>")
    assert b["responses"][1, : len(direct)].tolist() == direct
    assert b["response_mask"][1].tolist() == [1] * len(direct) + [0] * (len(row) - len(direct))
    assert nt["tool_call_counts"].tolist() == [1, 0]
    assert nt["tool_error_counts"].tolist() == [0, 0]
    assert nt["num_turns"].tolist() == [2, 1]
    # The engine got each live conversation unpadded, the tool's answer included, the second
    # time round; row 1 had ended.
    first = "<bos><|user|>123+456=<|assistant|>"
    assert script.contexts == [
        first,
        "<bos><|user|><tool_response>9</tool_response><|assistant|>",
        first + CALL + "<eos><|user|><tool_response>579</tool_response><|assistant|>",
    ]


# -- a real vLLM engine (CPU build here) -------------------------------------------------------
HAS_VLLM = importlib.util.find_spec("vllm") is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def teach_tool_use(model, tokenizer, steps: int = 400) -> float:
    """Fit ``model`` (on ``DEVICE``) to one transcript: call the calculator, copy its answer.

    Only the assistant's tokens are learned. Return the last loss.
    """
    pieces = [
        ("<bos><|user|>123+456=<|assistant|>", False),
        (CALL + "<eos>", True),
        ("<|user|><tool_response>579</tool_response><|assistant|>", False),
        ("579<eos>", True),
    ]
    ids: list[int] = []
    labels: list[int] = []
    for text, learned in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if learned else [-100] * len(piece)
    input_ids = torch.tensor([ids], device=DEVICE)
    targets = torch.tensor([labels], device=DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, labels=targets).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_VLLM and os.environ.get("POSTTRAIN_REQUIRE_VLLM") != "1", reason="needs vLLM"
)
def test_tool_calls_through_a_real_vllm_engine_are_masked_and_counted(tmp_path, tools):
    from tests.engine.rollout.contract import gpu_rollout_config
    from tests.engine.rollout.test_vllm_engine import rollout_config

    tokenizer = tool_tokenizer()
    model = random_qwen2(tokenizer, seed=0).to(DEVICE)
    assert teach_tool_use(model, tokenizer) < 1e-2
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rollout_cfg = gpu_rollout_config("vllm") if DEVICE == "cuda" else rollout_config()
    engine = VLLMRollout(str(folder), tokenizer, rollout_cfg, max_model_len=256)
    rollout = MultiTurnRollout(engine, tokenizer, config(), tools=tools)
    out = rollout.generate_sequences(
        chat_prompts(tokenizer, ["123+456="]), max_new_tokens=128, sampling=GREEDY
    )

    b, nt = out.batch, out.non_tensor_batch
    assert nt["tool_call_counts"].tolist() == [1]
    assert nt["tool_error_counts"].tolist() == [0]
    assert nt["truncated"].tolist() == [False]
    # Exactly the tool's turn (its answer, rendered by the template) is out of the loss.
    tool_answer = nt["messages"][0][2]
    assert tool_answer["role"] == "tool"
    tool = tokenizer(
        f"<|user|><tool_response>{tool_answer['content']}</tool_response><|assistant|>",
        add_special_tokens=False,
    )["input_ids"]
    mask = b["response_mask"][0].tolist()
    width = int(b["attention_mask"][0, b["prompts"].shape[1] :].sum())
    start = mask.index(0)
    assert mask[start : start + len(tool)] == [0] * len(tool)
    assert mask[:start] == [1] * start and mask[start + len(tool) : width] == [1] * (
        width - start - len(tool)
    )
    assert b["responses"][0, start : start + len(tool)].tolist() == tool
    assert b["rollout_log_probs"][0, start : start + len(tool)].tolist() == [0.0] * len(tool)
    # vLLM's log-probs of the policy's tokens, each turn in its own call, are those of one
    # Hugging Face forward over the whole conversation (fp32 on a CPU, bf16 on a GPU).
    policy = b["response_mask"].bool()
    if DEVICE == "cpu":
        from tests.engine.rollout.test_vllm_engine import LOGP_ATOL

        expected = hf_response_log_probs(model, out, device="cpu")
        tolerance = {"atol": LOGP_ATOL, "rtol": 0.0}
    else:
        expected = hf_response_log_probs(model.to(torch.bfloat16), out)
        tolerance = {"atol": 0.05, "rtol": 0.05}
    torch.testing.assert_close(b["rollout_log_probs"][policy], expected[policy], **tolerance)
