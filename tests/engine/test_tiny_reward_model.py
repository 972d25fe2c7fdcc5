"""The embedded tiny reward model: its wrong replies, its cache and how well it ranks answers."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from engine.rewards.reward_model import RewardModelScorer
from engine.tiny import resolve_tiny_path
from engine.tiny.reward_model import (
    REWARD_MODEL_RECIPE,
    ensure_tiny_reward_model,
    reward_model_hash,
    wrong_answer,
)
from engine.tiny.task import Problem, split_pool

# Measured 2026-12-05 on one CPU: 0.78 after 700 training steps (0.905 on another CPU the day
# before), 0.895 after 1200, 1.0 after 1600 (the recipe's).
NEAR_MISS_ACCURACY = 0.85


def test_a_wrong_reply_is_never_the_answer_and_takes_every_form():
    rng = random.Random(0)
    problems = [Problem(a, b) for a in (0, 5, 9, 47, 99) for b in (0, 1, 50, 99)]
    replies = [(p, wrong_answer(p, rng)) for p in problems for _ in range(50)]
    for problem, reply in replies:
        assert reply and reply != problem.answer
        assert not (reply.isdigit() and int(reply) == problem.a + problem.b)  # "047" is right too
    texts = [reply for _, reply in replies]
    assert any(not r.isdigit() for r in texts)  # junk around the answer
    near = [r for p, r in replies if r.isdigit() and abs(int(r) - (p.a + p.b)) in (1, 10)]
    assert len(near) > 20  # off by one, and carry errors


def test_the_hash_follows_the_recipe():
    assert reward_model_hash() == reward_model_hash(REWARD_MODEL_RECIPE)
    other = replace(REWARD_MODEL_RECIPE, seed=1)
    assert reward_model_hash(other) != reward_model_hash()


@pytest.fixture(scope="module")
def reward_model_dir():
    return ensure_tiny_reward_model()


def test_tiny_reward_model_is_cached_and_named_by_its_uri(reward_model_dir):
    assert resolve_tiny_path("tiny://reward_model") == str(reward_model_dir)
    assert ensure_tiny_reward_model() == reward_model_dir  # no second build
    assert reward_model_dir.name == reward_model_hash()
    with pytest.raises(ValueError, match="tiny://reward_model"):
        resolve_tiny_path("tiny://reward")


def test_it_ranks_the_answer_above_wrong_replies_on_held_out_problems(reward_model_dir):
    # Scored as the trainer scores: the scorer renders the chat messages with the model's template.
    scorer = RewardModelScorer(reward_model_dir, micro_batch_size=64)
    rng = random.Random(123)
    problems = rng.sample(split_pool("val"), 200)  # never seen in training
    prompts = [[{"role": "user", "content": p.question}] for p in problems]
    right = scorer.score(prompts, [p.answer for p in problems])
    wins = []
    for _ in range(3):
        wrong = scorer.score(prompts, [wrong_answer(p, rng) for p in problems])
        wins += [r > w for r, w in zip(right, wrong, strict=True)]
    accuracy = sum(wins) / len(wins)
    assert accuracy >= 0.9, accuracy
    # The answers score high and wrong replies low, not only in order.
    assert sum(r > 0 for r in right) / len(right) >= 0.8


def test_it_ranks_the_answer_above_near_misses(reward_model_dir):
    # Off by one or by ten (a carry): the policy's commonest mistakes, which RL exploits when the
    # model cannot tell them from the answer.
    scorer = RewardModelScorer(reward_model_dir, micro_batch_size=64)
    rng = random.Random(7)
    problems = rng.sample(split_pool("val"), 200)
    prompts = [[{"role": "user", "content": p.question}] for p in problems]
    right = scorer.score(prompts, [p.answer for p in problems])
    near = [str(p.a + p.b + rng.choice([-10, -1, 1, 10])) for p in problems]
    near_scores = scorer.score(prompts, [r if int(r) >= 0 else "100" for r in near])
    wins = [r > n for r, n in zip(right, near_scores, strict=True)]
    assert sum(wins) / len(wins) >= NEAR_MISS_ACCURACY
