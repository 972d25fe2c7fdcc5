import pytest

from engine.rewards.batch import RewardInput
from engine.rewards.composite import CompositeReward


def answer_length(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * len(solution_str)


def test_weighted_sum_of_named_and_function_components():
    composite = CompositeReward(
        [
            ("exact_match", 0.5, {"case_sensitive": False}),
            ("keyword", 0.25, {"keywords": ["paris", "france", "capital"]}),
            (answer_length, 0.1, {"scale": 0.5}),
        ]
    )
    result = composite("exact_match", "Paris", "paris")
    # exact 1.0, keyword 1/3, length 0.5 * 5 = 2.5
    assert result["score"] == pytest.approx(0.5 * 1.0 + 0.25 / 3 + 0.1 * 2.5)
    assert result["score/exact_match"] == 1.0
    assert result["score/keyword"] == pytest.approx(1 / 3)
    assert result["score/answer_length"] == 2.5


def test_dict_components_keep_their_parts_and_duplicate_names_are_numbered():
    composite = CompositeReward(
        [
            ("sql_safety", 1.0, {"allowed_tables": ["users"]}),
            ("keyword", 0.5, {"keywords": ["users"]}),
            ("keyword", 0.5, {"keywords": ["orders"]}),
        ]
    )
    result = composite("sql", "SELECT * FROM users", None)
    assert result["score/sql_safety"] == pytest.approx(1.0)
    assert result["sql_safety/safe"] == 1 and result["sql_safety/reasons"] == ""
    assert (result["score/keyword"], result["score/keyword_2"]) == (1.0, 0.0)
    assert result["score"] == pytest.approx(1.0 + 0.5)


def test_keyword_plus_classifier_scores_the_model_in_batch(reward_model_scorer):
    composite = CompositeReward(
        [("keyword", 0.3, {"keywords": ["blue"]}), ("reward_model", 0.7, {})],
        reward_model=reward_model_scorer,
    )
    prompts = ["name a colour", "name a fruit", "say hi"]
    responses = ["blue", "apple", "blue sky"]
    samples = [RewardInput("chat", r, None, None) for r in responses]
    outcomes = composite.score_batch(samples, prompts)
    model_scores = reward_model_scorer.score(prompts, responses)
    for outcome, keyword_score, model_score in zip(outcomes, [1, 0, 1], model_scores, strict=True):
        assert outcome.error is None
        assert outcome.result["score"] == pytest.approx(0.3 * keyword_score + 0.7 * model_score)
        assert outcome.result["score/reward_model"] == pytest.approx(model_score)
    single = composite("chat", "apple", None, prompt_text="name a fruit")
    assert single["score"] == pytest.approx(outcomes[1].result["score"], abs=1e-5)


def test_a_raising_component_fails_only_its_sample():
    def picky(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "bad":
            raise ValueError("cannot score 'bad'")
        return 1.0

    composite = CompositeReward([(picky, 2.0)])
    outcomes = composite.score_batch([RewardInput("s", t, None, None) for t in ("ok", "bad")])
    assert outcomes[0].result == {"score": 2.0, "score/picky": 1.0}
    assert outcomes[1] == (None, "ValueError: cannot score 'bad'")


def test_configuration_errors_say_what_to_do():
    with pytest.raises(ValueError, match="at least one"):
        CompositeReward([])
    with pytest.raises(ValueError, match=r"\(name_or_fn, weight\)"):
        CompositeReward([("keyword",)])
    with pytest.raises(KeyError, match="registered: default"):
        CompositeReward([("nope", 1.0)])
    with pytest.raises(ValueError, match="reward_model=RewardModelScorer"):
        CompositeReward([("reward_model", 1.0)])
    with pytest.raises(ValueError, match="one prompt text per sample"):
        CompositeReward([("reward_model", 1.0)], reward_model=_NoModel()).score_batch(
            [RewardInput("s", "x", None, None)]
        )


class _NoModel:
    def score(self, prompts, responses):
        raise AssertionError("not reached")
