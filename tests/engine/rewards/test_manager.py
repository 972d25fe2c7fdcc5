import logging

import pytest
import torch

from engine.data.proto import DataProto
from engine.rewards.manager import RewardManager

RESPONSE_LEN = 24

RAISING_REWARD = """
from engine.rewards import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "boom" in solution_str:
        raise ValueError(f"cannot score {solution_str!r}")
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def make_batch(tokenizer, rows, *, prompt_key="prompt_text"):
    """Build a rollout batch: responses end with EOS, then right padding."""
    responses = torch.full((len(rows), RESPONSE_LEN), tokenizer.pad_token_id)
    mask = torch.zeros(len(rows), RESPONSE_LEN, dtype=torch.long)
    for i, row in enumerate(rows):
        ids = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
        ids = ids + [tokenizer.eos_token_id]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    non_tensors = {
        "data_source": [row["data_source"] for row in rows],
        "reward_model": [{"ground_truth": row.get("ground_truth")} for row in rows],
        "extra_info": [row.get("extra_info") for row in rows],
    }
    if prompt_key == "prompt_text":
        non_tensors["prompt_text"] = [row.get("prompt", "") for row in rows]
    return DataProto.from_dict({"responses": responses, "response_mask": mask}, non_tensors)


@pytest.fixture
def raising_reward_file(tmp_path):
    path = tmp_path / "raising_reward.py"
    path.write_text(RAISING_REWARD)
    return path


def test_score_lands_on_the_last_valid_token(char_tokenizer):
    rows = [
        {"data_source": "tiny_arithmetic", "response": "12", "ground_truth": "12"},
        {"data_source": "openai/gsm8k", "response": "so #### 5", "ground_truth": "5"},
        {"data_source": "exact_match", "response": "yes", "ground_truth": "yes"},
    ]
    data = make_batch(char_tokenizer, rows)
    out = RewardManager(char_tokenizer)(data, return_dict=True)
    reward = out["reward_tensor"]
    assert reward.shape == (3, RESPONSE_LEN) and reward.dtype == torch.float32
    last = data.batch["response_mask"].sum(-1) - 1  # EOS positions: 2, 9, 3
    assert last.tolist() == [2, 9, 3]
    expected = torch.zeros(3, RESPONSE_LEN)
    expected[torch.arange(3), last] = 1.0
    assert torch.equal(reward, expected)
    assert out["reward_extra_info"] == {"score": [1.0, 1.0, 1.0], "reward_error": [None] * 3}
    assert out["meta_info"] == {"reward_failed": 0}
    # without return_dict: the tensor alone, as verl
    assert torch.equal(RewardManager(char_tokenizer)(data), expected)


def test_dict_parts_fill_every_list(char_tokenizer):
    rows = [
        {"data_source": "exact_match", "response": "no", "ground_truth": "yes"},
        {
            "data_source": "sql_safety",
            "response": "SELECT * FROM users",
            "ground_truth": "SELECT * FROM users",
            "extra_info": {"allowed_tables": ["orders"]},
        },
    ]
    out = RewardManager(char_tokenizer)(make_batch(char_tokenizer, rows), return_dict=True)
    info = out["reward_extra_info"]
    assert info["score"] == [0.0, pytest.approx(0.8)]
    assert info["tables_allowed"] == [None, 0] and info["safe"] == [None, 1]
    assert info["reasons"] == [None, "tables not allowed: users"]
    assert all(len(values) == 2 for values in info.values())
    assert out["reward_tensor"][1, len("SELECT * FROM users")].item() == pytest.approx(0.8)


def test_a_raising_reward_fails_only_its_sample(char_tokenizer, raising_reward_file):
    from engine.rewards.custom import load_custom_reward_fn

    rows = [
        {"data_source": "exact_match", "response": "ok", "ground_truth": "ok"},
        {"data_source": "exact_match", "response": "boom", "ground_truth": "boom"},
        {"data_source": "exact_match", "response": "fine", "ground_truth": "fine"},
    ]
    manager = RewardManager(
        char_tokenizer, compute_score=load_custom_reward_fn(raising_reward_file)
    )
    out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.0, 0.0, 1.0]
    assert out["reward_extra_info"]["reward_error"] == [
        None,
        "ValueError: cannot score 'boom'",
        None,
    ]
    assert out["meta_info"] == {"reward_failed": 1}
    assert out["reward_tensor"].sum().item() == 2.0


def test_unknown_data_source_fails_those_samples_and_warns_once(char_tokenizer, caplog):
    rows = [
        {"data_source": "mystery", "response": "a", "ground_truth": "a"},
        {"data_source": "exact_match", "response": "b", "ground_truth": "b"},
        {"data_source": "mystery", "response": "c", "ground_truth": "c"},
    ]
    manager = RewardManager(char_tokenizer)
    with caplog.at_level(logging.WARNING, logger="engine.rewards.manager"):
        out = manager(make_batch(char_tokenizer, rows), return_dict=True)
        manager(make_batch(char_tokenizer, rows), return_dict=True)
    errors = out["reward_extra_info"]["reward_error"]
    assert errors[0].startswith("NotImplementedError: Reward function is not implemented")
    assert errors[0] == errors[2] and errors[1] is None
    assert out["reward_extra_info"]["score"] == [0.0, 1.0, 0.0]
    assert out["meta_info"]["reward_failed"] == 2
    assert len([r for r in caplog.records if "mystery" in r.getMessage()]) == 1


def test_two_workers_give_the_same_results_as_one(char_tokenizer, raising_reward_file):
    from engine.rewards.custom import load_custom_reward_fn

    rows = [
        {"data_source": "gsm8k", "response": "#### 7", "ground_truth": "7"},
        {"data_source": "math", "response": "\\boxed{0.5}", "ground_truth": "\\frac{1}{2}"},
        {"data_source": "exact_match", "response": "boom", "ground_truth": "boom"},
        {"data_source": "sql_safety", "response": "DROP TABLE t", "ground_truth": None},
        {"data_source": "mystery", "response": "x", "ground_truth": "x"},
        {"data_source": "tiny_arithmetic", "response": "3", "ground_truth": "4"},
    ]
    data = make_batch(char_tokenizer, rows)
    fn = load_custom_reward_fn(raising_reward_file)
    serial = RewardManager(char_tokenizer, compute_score=fn)(data, return_dict=True)
    with RewardManager(char_tokenizer, compute_score=fn, num_workers=2) as manager:
        parallel = manager(data, return_dict=True)
    assert torch.equal(serial["reward_tensor"], parallel["reward_tensor"])
    assert serial["reward_extra_info"] == parallel["reward_extra_info"]
    assert serial["reward_extra_info"]["score"][:2] == [1.0, 1.0]
    assert parallel["meta_info"] == {"reward_failed": 2}


def test_keyword_plus_reward_model_reads_the_prompts(char_tokenizer, reward_model_scorer):
    rows = [
        {"data_source": "chat", "prompt": "name a colour", "response": "blue"},
        {"data_source": "chat", "prompt": "name a fruit", "response": "a pear"},
    ]
    manager = RewardManager(
        char_tokenizer,
        components=[("keyword", 0.3, {"keywords": ["blue"]}), ("reward_model", 0.7, {})],
        reward_model=reward_model_scorer,
    )
    out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    model = reward_model_scorer.score(["name a colour", "name a fruit"], ["blue", "a pear"])
    info = out["reward_extra_info"]
    assert info["score/reward_model"] == pytest.approx(model)
    assert info["score/keyword"] == [1.0, 0.0]
    assert info["score"] == pytest.approx([0.3 + 0.7 * model[0], 0.7 * model[1]])
    assert out["reward_tensor"][0, 4].item() == pytest.approx(info["score"][0])


def test_prompts_are_decoded_from_the_batch_without_prompt_text(
    char_tokenizer, reward_model_scorer
):
    data = make_batch(char_tokenizer, [{"data_source": "chat", "response": "ok"}], prompt_key=None)
    prompt_ids = char_tokenizer("hi there", add_special_tokens=False)["input_ids"]
    prompts = torch.tensor([[0, 0] + prompt_ids])  # left-padded
    data.batch["prompts"] = prompts
    data.batch["attention_mask"] = torch.cat([prompts != 0, data.batch["response_mask"].bool()], -1)
    manager = RewardManager(char_tokenizer, reward_model=reward_model_scorer)
    out = manager(data, return_dict=True)
    assert out["reward_extra_info"]["score"] == [
        pytest.approx(reward_model_scorer.score(["hi there"], ["ok"])[0])
    ]


def test_configuration_errors_raise(char_tokenizer):
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        RewardManager(char_tokenizer, compute_score=lambda *a, **k: 1.0, num_workers=2)
    with pytest.raises(ValueError, match="either compute_score or components"):
        RewardManager(char_tokenizer, compute_score="gsm8k", components=[("keyword", 1.0)])
    rows = [{"data_source": "gsm8k", "response": "1", "ground_truth": "1"}]
    with pytest.raises(KeyError, match="reward_fn_key 'source'"):
        RewardManager(char_tokenizer, reward_fn_key="source")(make_batch(char_tokenizer, rows))


def test_a_multi_turn_mask_with_gaps_scores_the_whole_response(char_tokenizer):
    # Assistant "1", an interaction turn " x" (mask 0), then the assistant's final "2" + EOS.
    rows = [{"data_source": "exact_match", "response": "1 x2", "ground_truth": "1 x2"}]
    data = make_batch(char_tokenizer, rows)
    data.batch["response_mask"][0, 1:3] = 0  # the interaction's tokens
    out = RewardManager(char_tokenizer)(data, return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.0]  # decoded up to the last assistant token
    assert out["reward_tensor"][0].nonzero().flatten().tolist() == [4]  # the EOS after "2"
