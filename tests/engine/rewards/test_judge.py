"""The generative judge: its parsers and template, its rate limits and timeout, and the embedded
tiny model judging for real (alone, through the reward manager, and beside a rule reward)."""

import re

import pytest

from engine.config import config_from_dict
from engine.rewards.batch import RewardInput
from engine.rewards.judge import JudgeScorer, TokenBucket
from engine.rewards.judge_prompt import (
    JudgeParseError,
    build_parser,
    render_template,
    template_problem,
)
from engine.rewards.manager import RewardManager
from tests.engine.rewards.test_manager import make_batch

# The tiny model answers "a+b=" additions, so a judge prompt "<response>+1=" gets a number back.
TINY_JUDGE = {
    "actor_rollout_ref": {"model": {"path": "tiny://model"}},
    "reward_model": {
        "enable": True,
        "model": {"path": "tiny://model"},
        "judge": {"prompt_template": "{response}+1="},
        "rollout": {"response_length": 6, "prompt_length": 64, "max_num_seqs": 16},
    },
}


def tiny_judge(**judge: object):
    from engine.trainer.build import build_reward_scorer

    raw = {**TINY_JUDGE, "reward_model": {**TINY_JUDGE["reward_model"]}}
    raw["reward_model"]["judge"] = {**raw["reward_model"]["judge"], **judge}
    return build_reward_scorer(config_from_dict(raw))


def samples_of(responses, ground_truths=None):
    truths = ground_truths or [None] * len(responses)
    return [
        RewardInput("tiny_arithmetic", r, t, None) for r, t in zip(responses, truths, strict=True)
    ]


# -- parsers ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "score"),
    [("Score: 7", 7.0), ("3 then -2.5", -2.5), ("rated 1e1 out of 10", 10.0), ("42", 42.0)],
)
def test_number_parser_reads_the_last_number(reply, score):
    assert build_parser("number")(reply) == score


@pytest.mark.parametrize(
    ("reply", "score"),
    [("Yes.", 1.0), ("no", 0.0), ("Is it? no... YES", 1.0), ("Verdict: PARTIAL", 0.5)],
)
def test_verdict_parser_maps_the_last_verdict_word_ignoring_case(reply, score):
    parse = build_parser("verdict", {"yes": 1.0, "no": 0.0, "partial": 0.5})
    assert parse(reply) == score


def test_verdict_words_match_whole_words_only():
    with pytest.raises(JudgeParseError, match=r"none of the verdict words \(yes, no\)"):
        build_parser("verdict")("nothing eyes nobody")


@pytest.mark.parametrize(
    ("reply", "score"),
    [("so \\boxed{3} or \\boxed{ 8 }", 8.0), ("\\boxed{-0.5}", -0.5), ("\\boxed{Yes}", 1.0)],
)
def test_boxed_parser_reads_the_last_box(reply, score):
    assert build_parser("boxed", {"yes": 1.0, "no": 0.0})(reply) == score


@pytest.mark.parametrize(
    ("kind", "reply", "message"),
    [
        ("number", "I cannot say.", "no number in the judge's reply"),
        ("verdict", "maybe", "none of the verdict words"),
        ("boxed", "the answer is 5", r"no \\boxed\{\} value"),
        ("boxed", "\\boxed{five}", r"\\boxed\{five\} is not a number"),
        ("boxed", "\\boxed{1", r"no \\boxed\{\} value"),
    ],
)
def test_garbage_is_a_parse_error_never_a_zero(kind, reply, message):
    with pytest.raises(JudgeParseError, match=message):
        build_parser(kind)(reply)


@pytest.mark.parametrize(
    ("kind", "verdicts", "message"),
    [
        ("vote", None, "unknown judge parser 'vote'; choose one of number, verdict, boxed"),
        ("verdict", {}, "is empty"),
        ("verdict", {"yes": "1"}, "a verdict's score is a number"),
        ("verdict", {"yes": float("nan")}, "finite"),
        ("verdict", {" yes": 1}, "without surrounding spaces"),
        ("verdict", {"Yes": 1, "yes": 0}, "differ only in case"),
    ],
)
def test_a_parser_that_cannot_be_built_says_why(kind, verdicts, message):
    with pytest.raises(ValueError, match=message):
        build_parser(kind, verdicts)


# -- the template -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("Rate {answer}", r"unknown field \{answer\}; the fields are \{prompt\}, \{response\}"),
        ("{response.__class__}", r"unknown field \{response.__class__\}"),
        ("{response[0]}", "unknown field"),
        ("{response!r}", r"formats the field \{response\} \(!r\)"),
        ("{response:>10}", "formats the field"),
        ("Q: {prompt}", r"never shows the judge the response; add the field \{response\}"),
        ("{response} {", "cannot be read as a template"),
    ],
)
def test_template_problems_name_the_fix(template, message):
    problem = template_problem(template)
    assert problem is not None and re.search(message, problem)


def test_template_renders_the_sample_fields_and_literal_braces():
    template = "{{json}} {prompt}|{response}|{ground_truth}|{data_source}"
    assert template_problem(template) is None
    fields = {"prompt": "Q", "response": "A", "ground_truth": None, "data_source": "d"}
    assert render_template(template, fields) == "{json} Q|A||d"


# -- batching, rate limits and the timeout -------------------------------------------------------
class Clock:
    """A clock that moves only when the scorer sleeps."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def echo_judge(batches, **settings):
    """A judge whose 'model' repeats its prompt: the limits are what is under test here."""

    def generate(texts):
        batches.append(list(texts))
        return list(texts)

    clock = Clock()
    scorer = JudgeScorer(
        generate, template="{response}", clock=clock, sleep=clock.sleep, **settings
    )
    return scorer, clock


def test_requests_per_minute_space_the_batches():
    batches = []
    scorer, clock = echo_judge(batches, batch_size=2, max_rpm=60)
    judged = scorer.judge(samples_of([str(n) for n in range(6)]))
    assert [j.score for j in judged] == [0, 1, 2, 3, 4, 5]
    assert batches == [["0", "1"], ["2", "3"], ["4", "5"]]
    # One request a second: the first batch spends the bucket's one token and a token of debt.
    assert clock.sleeps == [2.0, 2.0]


def test_tokens_per_minute_count_the_estimate_per_request():
    batches = []
    scorer, clock = echo_judge(batches, batch_size=1, max_tpm=6000, estimated_tokens_per_request=50)
    scorer.judge(samples_of(["1", "2", "3"]))
    assert clock.sleeps == [0.5]  # 100 tokens a second: two requests, then half a second


def test_samples_past_the_timeout_are_errors_not_zeros():
    batches = []
    scorer, clock = echo_judge(batches, batch_size=2, max_rpm=60, timeout=3)
    judged = scorer.judge(samples_of([str(n) for n in range(6)]))
    assert [j.score for j in judged[:4]] == [0, 1, 2, 3]
    assert [j.score for j in judged[4:]] == [None, None]
    assert judged[4].error.startswith(
        "TimeoutError: the judge did not reach this sample within reward_model.timeout=3s"
    )
    assert len(batches) == 2


def test_token_bucket_refills_at_its_rate():
    clock = Clock()
    bucket = TokenBucket(2.0, clock)
    bucket.take(2)
    assert bucket.wait_time(1) == 0.5
    clock.sleep(0.5)
    assert bucket.wait_time(1) == 0.0
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(0)


# -- the tiny model as judge --------------------------------------------------------------------
def test_tiny_judge_generates_and_batching_does_not_change_the_replies():
    judge = tiny_judge()
    samples = samples_of(["12", "40", "7", "88", "3"])
    batched = judge.judge(samples, [""] * 5)
    judge.batch_size = 1
    assert judge.judge(samples, [""] * 5) == batched  # greedy: the same replies one by one
    for j in batched:
        assert j.error is None and j.text and j.score == float(j.text.strip())


def test_too_long_a_judge_prompt_is_that_samples_error():
    judge = tiny_judge()
    judged = judge.judge(samples_of(["1", "9" * 80]), ["", ""])
    assert judged[0].error is None
    assert judged[1].error.startswith(
        "ValueError: the judge prompt has 86 tokens, over reward_model.rollout.prompt_length=64"
    )


def test_sampling_temperature_reaches_the_generator():
    assert tiny_judge(temperature=0.7).generate.sampling["do_sample"] is True
    assert tiny_judge().generate.sampling["do_sample"] is False


def test_a_reply_the_parser_cannot_read_is_a_recorded_reward_error(char_tokenizer):
    judge = tiny_judge(parser="verdict")  # the tiny model answers digits, never yes or no
    rows = [{"data_source": "tiny_arithmetic", "response": r, "ground_truth": "5"} for r in "12"]
    manager = RewardManager(char_tokenizer, reward_model=judge)
    out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    info = out["reward_extra_info"]
    assert out["meta_info"]["reward_failed"] == 2
    assert all(
        e.startswith("JudgeParseError: none of the verdict words") for e in info["reward_error"]
    )
    assert all(t and t.strip().isdigit() for t in info["reward_model/judge_text"])


def test_judge_composes_with_a_rule_reward(char_tokenizer):
    judge = tiny_judge()
    rows = [
        {"data_source": "tiny_arithmetic", "response": "12", "ground_truth": "12"},
        {"data_source": "tiny_arithmetic", "response": "30", "ground_truth": "31"},
    ]
    expected = judge.judge(samples_of(["12", "30"], ["12", "31"]), ["", ""])
    manager = RewardManager(
        char_tokenizer, components=[("exact_match", 0.5), ("reward_model", 0.5)], reward_model=judge
    )
    out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    info = out["reward_extra_info"]
    assert info["reward_error"] == [None, None]
    assert info["score/exact_match"] == [1.0, 0.0]
    assert info["score/reward_model"] == [expected[0].score, expected[1].score]
    assert info["score"] == pytest.approx(
        [0.5 * 1.0 + 0.5 * expected[0].score, 0.5 * expected[1].score]
    )
    assert info["reward_model/judge_text"] == [expected[0].text, expected[1].text]


def test_the_scorer_refuses_a_template_the_validator_would_refuse():
    with pytest.raises(ValueError, match=r"prompt_template has the unknown field \{answer\}"):
        JudgeScorer(list, template="{answer}")
