"""verl's DAPO reward manager: the overlong penalty worked out by hand, acc, and its settings."""

import pytest
import torch

from engine.config.reward_kwargs import reward_kwargs_problems
from engine.rewards.dapo import DAPORewardManager
from engine.rewards.overlong import OverlongBuffer, overlong_buffer
from tests.engine.rewards.test_manager import RESPONSE_LEN, make_batch


def test_the_penalty_is_linear_inside_the_buffer_and_zero_before_it():
    # max_resp_len 20, buffer 8: expected = 12 tokens; each token past it costs 1/8 * 0.5.
    buffer = OverlongBuffer(max_resp_len=20, len=8, penalty_factor=0.5)
    assert buffer.penalty(5) == 0.0  # exceed -7: min(+0.4375, 0)
    assert buffer.penalty(12) == 0.0  # exceed 0
    assert buffer.penalty(13) == pytest.approx(-0.0625)  # -1/8 * 0.5
    assert buffer.penalty(16) == pytest.approx(-0.25)  # -4/8 * 0.5
    assert buffer.penalty(20) == pytest.approx(-0.5)  # the whole factor at the limit


def test_the_dapo_manager_adds_the_penalty_on_the_last_token_and_logs_it(char_tokenizer):
    # Responses (+ EOS): "12" -> 3 tokens, "12 is the sum" -> 14 tokens, "nope" -> 5 tokens.
    rows = [
        {"data_source": "tiny_arithmetic", "response": "12", "ground_truth": "12"},
        {"data_source": "tiny_arithmetic", "response": "12 is the sum", "ground_truth": "12"},
        {"data_source": "tiny_arithmetic", "response": "nope", "ground_truth": "12"},
    ]
    data = make_batch(char_tokenizer, rows)
    kwargs = {
        "max_resp_len": 8,
        "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True},
    }
    manager = DAPORewardManager(char_tokenizer, overlong=overlong_buffer(kwargs))
    out = manager(data, return_dict=True)
    # expected = 8 - 4 = 4 tokens. 3 tokens: 0. 14: min(-10/4, 0) = -2.5. 5: -1/4 = -0.25.
    info = out["reward_extra_info"]
    assert info["overlong_reward"] == [0.0, -2.5, -0.25]
    assert info["overlong"] == [False, True, True]
    assert info["acc"] == [1.0, 1.0, 0.0]  # the float scores, as verl's DAPO manager
    assert info["score"] == [1.0, 1.0, 0.0]  # the reward function's own, before the penalty
    expected = torch.zeros(3, RESPONSE_LEN)
    expected[0, 2], expected[1, 13], expected[2, 4] = 1.0, 1.0 - 2.5, -0.25
    assert torch.equal(out["reward_tensor"], expected)
    assert torch.equal(manager(data), expected)  # the tensor alone, as verl's return_dict=False


def test_without_log_the_penalty_applies_but_is_not_recorded(char_tokenizer):
    data = make_batch(char_tokenizer, [{"data_source": "tiny_arithmetic", "response": "12345"}])
    buffer = OverlongBuffer(max_resp_len=6, len=2, penalty_factor=1.0, log=False)
    out = DAPORewardManager(char_tokenizer, overlong=buffer)(data, return_dict=True)
    # 6 tokens (5 + EOS), expected 4: penalty -2/2 * 1.0 = -1; the score (no ground truth) fails.
    assert out["reward_tensor"][0, 5].item() == pytest.approx(-1.0)
    assert "overlong_reward" not in out["reward_extra_info"]
    assert "overlong" not in out["reward_extra_info"]


def test_without_a_buffer_the_dapo_manager_only_records_acc(char_tokenizer):
    data = make_batch(
        char_tokenizer,
        [{"data_source": "tiny_arithmetic", "response": "7" * 20, "ground_truth": "1"}],
    )
    out = DAPORewardManager(char_tokenizer)(data, return_dict=True)
    assert out["reward_tensor"].sum().item() == 0.0
    assert out["reward_extra_info"]["acc"] == [0.0]


@pytest.mark.parametrize(
    ("manager", "kwargs", "key", "words"),
    [
        ("naive", {"max_resp_len": 8}, "reward_kwargs.max_resp_len", "takes no arguments"),
        ("dapo", {"max_len": 8}, "reward_kwargs.max_len", "takes only max_resp_len"),
        (
            "dapo",
            {"overlong_buffer_cfg": {"enable": True, "len": 4}},
            "reward_kwargs.max_resp_len",
            "needs the response limit",
        ),
        (
            "dapo",
            {"max_resp_len": 2, "overlong_buffer_cfg": {"enable": True, "len": 4}},
            "reward_kwargs.max_resp_len",
            ">= overlong_buffer_cfg.len=4",
        ),
        (
            "dapo",
            {"max_resp_len": 8, "overlong_buffer_cfg": {"enable": True, "len": 0}},
            "overlong_buffer_cfg.len",
            "must be > 0",
        ),
        (
            "dapo",
            {"max_resp_len": 8, "overlong_buffer_cfg": {"enable": True, "length": 4}},
            "overlong_buffer_cfg.length",
            "its keys: enable, len, penalty_factor, log",
        ),
        (
            "dapo",
            {"max_resp_len": 8, "overlong_buffer_cfg": {"enable": "yes", "len": 4}},
            "overlong_buffer_cfg.enable",
            "True or False",
        ),
    ],
)
def test_bad_reward_kwargs_are_named_with_the_fix(manager, kwargs, key, words):
    problems = reward_kwargs_problems(manager, kwargs)
    assert len(problems) == 1, problems
    assert problems[0][0].endswith(key) and words in problems[0][1]


def test_a_disabled_buffer_needs_nothing_else():
    assert reward_kwargs_problems("dapo", {"overlong_buffer_cfg": {"enable": False}}) == []
    assert overlong_buffer({"overlong_buffer_cfg": {"enable": False}}) is None


# -- the keys that select it (each test fails if its key were ignored) ----------------------------


def _manager(char_tokenizer, *overrides):
    from engine.config import load_config
    from engine.trainer.build import build_reward_manager

    return build_reward_manager(load_config("grpo_tiny", list(overrides)), char_tokenizer)


ROWS = [
    {"data_source": "tiny_arithmetic", "response": "12", "ground_truth": "12"},  # 3 tokens
    {"data_source": "tiny_arithmetic", "response": "12 is it", "ground_truth": "12"},  # 9
]


def test_reward_model_reward_manager_dapo_records_acc(char_tokenizer):
    data = make_batch(char_tokenizer, ROWS)
    naive = _manager(char_tokenizer)(data, return_dict=True)["reward_extra_info"]
    dapo = _manager(char_tokenizer, "reward_model.reward_manager=dapo")(data, return_dict=True)
    assert "acc" not in naive
    assert dapo["reward_extra_info"]["acc"] == [1.0, 1.0]


def test_reward_model_reward_kwargs_set_the_overlong_penalty(char_tokenizer):
    data = make_batch(char_tokenizer, ROWS)
    manager = _manager(
        char_tokenizer,
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.max_resp_len=8",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True",
    )
    out = manager(data, return_dict=True)
    # expected 8 - 4 = 4 tokens; 9 tokens exceed by 5: -5/4 * 0.5 = -0.625.
    assert out["reward_extra_info"]["overlong_reward"] == [0.0, -0.625]
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.375]


def test_reward_model_overlong_buffer_counts_back_from_max_response_length(char_tokenizer):
    data = make_batch(char_tokenizer, ROWS)
    manager = _manager(
        char_tokenizer,
        "reward_model.reward_manager=dapo",
        "data.max_response_length=10",
        "reward_model.overlong_buffer.enable=True",
        "reward_model.overlong_buffer.len=4",
        "reward_model.overlong_buffer.penalty_factor=1.0",
    )
    # expected 10 - 4 = 6 tokens; 9 tokens exceed by 3: -3/4 = -0.75; not logged.
    out = manager(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.25]
    assert "overlong_reward" not in out["reward_extra_info"]
