"""reward_model.enable=True in the trainer: the scorer it builds, how its score is combined, checks.

Keys named here, each with a test that fails if it were ignored: reward_model.enable,
reward_model.model.path, reward_model.micro_batch_size_per_gpu, reward_model.micro_batch_size
(verl's deprecated global size), reward_model.max_length, reward_model.model.trust_remote_code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import ConfigValidationError, resolve_config, validate_config
from engine.data.proto import DataProto
from engine.rewards.arithmetic import DATA_SOURCE
from engine.rewards.reward_model import RewardModelScorer
from engine.tiny.reward_model import build_classifier
from engine.tiny.tokenizer import build_tokenizer
from engine.trainer import PPOTrainer, Recorder
from engine.trainer.build import build_reward_manager, build_reward_scorer

QUESTIONS = ["12+35=", "3+4=", "50+50="]
REPLIES = ["47", "8", "100"]  # right, wrong, right
ANSWERS = ["47", "7", "100"]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """Save a randomly initialised one-label classifier with the tiny tokenizer; return the folder."""
    tokenizer = build_tokenizer()
    folder = tmp_path_factory.mktemp("rm")
    build_classifier(tokenizer, seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def rm_overrides(folder, *extra: str) -> tuple[str, ...]:
    return (
        "reward_model.enable=True",
        f"reward_model.model.path={folder}",
        "reward_model.micro_batch_size_per_gpu=2",
        *extra,
    )


def rollout_batch(tokenizer) -> DataProto:
    """Return a batch of the tiny task's replies with verl's raw_prompt chat messages."""
    encoded = [tokenizer(r, add_special_tokens=False)["input_ids"] + [2] for r in REPLIES]
    width = max(map(len, encoded))
    responses = torch.tensor([ids + [0] * (width - len(ids)) for ids in encoded])
    mask = (torch.arange(width) < torch.tensor([len(ids) for ids in encoded])[:, None]).long()
    raw_prompt = np.empty(len(QUESTIONS), dtype=object)  # one list of messages per row
    for i, question in enumerate(QUESTIONS):
        raw_prompt[i] = [{"role": "user", "content": question}]
    return DataProto.from_dict(
        {"responses": responses, "response_mask": mask},
        {
            "data_source": [DATA_SOURCE] * len(QUESTIONS),
            "reward_model": [{"ground_truth": answer} for answer in ANSWERS],
            "raw_prompt": raw_prompt,
            "prompt_text": ["not what the reward model reads"] * len(QUESTIONS),
        },
    )


def model_scores(folder) -> list[float]:
    scorer = RewardModelScorer(folder, micro_batch_size=3)
    return scorer.score([[{"role": "user", "content": q}] for q in QUESTIONS], REPLIES)


def test_reward_model_enable_makes_the_model_score_alone_as_in_verl(make_config, classifier_dir):
    # reward_model.enable, reward_model.model.path: with no components the model's score is the
    # reward, though the data source has a rule (verl returns rm_scores and skips the rule).
    config = resolve_config(make_config("grpo_tiny", *rm_overrides(classifier_dir)))
    tokenizer = build_tokenizer()
    out = build_reward_manager(config, tokenizer)(rollout_batch(tokenizer), return_dict=True)
    expected = model_scores(classifier_dir)
    assert out["reward_extra_info"]["score"] == pytest.approx(expected, abs=1e-5)
    assert out["reward_extra_info"]["score/reward_model"] == pytest.approx(expected, abs=1e-5)
    assert len({round(s, 4) for s in expected}) == 3  # not a constant, not the 1/0 rule
    off = resolve_config(make_config("grpo_tiny"))
    rule = build_reward_manager(off, tokenizer)(rollout_batch(tokenizer), return_dict=True)
    assert rule["reward_extra_info"]["score"] == [1.0, 0.0, 1.0]


def test_a_reward_model_component_is_weighed_against_the_rule(make_config, classifier_dir):
    config = resolve_config(
        make_config(
            "grpo_tiny",
            *rm_overrides(
                classifier_dir,
                "reward.components=[{name: tiny_arithmetic, weight: 2.0}, "
                "{name: reward_model, weight: 0.5}]",
            ),
        )
    )
    tokenizer = build_tokenizer()
    out = build_reward_manager(config, tokenizer)(rollout_batch(tokenizer), return_dict=True)
    model = model_scores(classifier_dir)
    rule = [1.0, 0.0, 1.0]
    expected = [2.0 * r + 0.5 * m for r, m in zip(rule, model, strict=True)]
    assert out["reward_extra_info"]["score"] == pytest.approx(expected, abs=1e-5)
    assert out["reward_extra_info"]["score/tiny_arithmetic"] == rule


def test_the_scorer_reads_the_batch_size_and_length_keys(make_config, classifier_dir):
    # reward_model.micro_batch_size_per_gpu and reward_model.max_length reach the scorer; null
    # max_length is the prompt and response budget.
    config = resolve_config(
        make_config("grpo_tiny", *rm_overrides(classifier_dir, "reward_model.max_length=5"))
    )
    scorer = build_reward_scorer(config)
    assert (scorer.micro_batch_size, scorer.max_length) == (2, 5)
    # Five tokens from the left-truncated end: only "<|assistant|>47<eos>" and a bit remain, so
    # two questions with the same reply now score alike.
    same = scorer.score(["1+2=", "9+9="], ["47", "47"])
    assert same[0] == pytest.approx(same[1], abs=1e-6)
    default = build_reward_scorer(
        resolve_config(make_config("grpo_tiny", *rm_overrides(classifier_dir)))
    )
    assert default.max_length == config.data.max_prompt_length + config.data.max_response_length


def test_verls_reward_loop_needs_no_micro_batch_size_and_takes_the_servers_sequences(
    make_config, classifier_dir
):
    # As verl's examples write it: the reward loop (the default) with its server's keys.
    loop = (
        "reward_model.enable=True",
        f"reward_model.model.path={classifier_dir}",
        "reward_model.use_reward_loop=True",
        "reward_model.rollout.name=vllm",
        "reward_model.rollout.max_num_seqs=3",
    )
    cfg = make_config("grpo_tiny", *loop)
    warnings = validate_config(cfg, check_files=True)  # no error: nothing is missing
    assert any("reward_model.rollout.name='vllm'" in w for w in warnings)  # no server here
    scorer = build_reward_scorer(resolve_config(cfg))
    assert scorer.micro_batch_size == 3
    # The same classifier scores as with an explicit micro-batch size.
    explicit = build_reward_scorer(
        resolve_config(make_config("grpo_tiny", *loop, "reward_model.micro_batch_size_per_gpu=1"))
    )
    prompts, replies = ["1+2=", "9+9=", "2+2=", "5+1="], ["3", "18", "5", "6"]
    assert scorer.score(prompts, replies) == pytest.approx(explicit.score(prompts, replies))


def test_verls_global_micro_batch_size_is_divided_by_the_data_parallel_size(
    make_config, classifier_dir
):
    # reward_model.micro_batch_size (deprecated): 8 over 2 GPUs is 4 per forward.
    cfg = make_config(
        "grpo_tiny",
        "reward_model.enable=True",
        f"reward_model.model.path={classifier_dir}",
        "reward_model.micro_batch_size=8",
        "trainer.n_gpus_per_node=2",
    )
    assert any("micro_batch_size_per_gpu=4" in w for w in validate_config(cfg, check_files=False))
    assert build_reward_scorer(resolve_config(cfg)).micro_batch_size == 4


def test_trust_remote_code_reaches_the_loader(make_config, classifier_dir, monkeypatch):
    # reward_model.model.trust_remote_code: recorded on its way to the real loader.
    from transformers import AutoModelForSequenceClassification

    seen = []
    load = AutoModelForSequenceClassification.from_pretrained

    def recording(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", recording)
    for value in (True, False):
        overrides = rm_overrides(classifier_dir, f"reward_model.model.trust_remote_code={value}")
        build_reward_scorer(resolve_config(make_config("grpo_tiny", *overrides)))
    assert seen == [True, False]


def errors_of(cfg) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(cfg, check_files=True)
    return {e.key: e.message for e in caught.value.errors}


def test_a_folder_that_is_not_a_one_label_classifier_is_refused(make_config, tiny_assets):
    errors = errors_of(
        make_config("grpo_tiny", *rm_overrides(tiny_assets.model_dir))  # the causal policy
    )
    message = errors["reward_model.model.path"]
    assert "not a one-label sequence classifier" in message
    assert "Qwen2ForCausalLM" in message and "tiny://reward_model" in message


def test_a_reward_model_needs_its_batch_size_and_no_second_whole_reward(
    make_config, classifier_dir, tmp_path
):
    legacy = (
        "reward_model.enable=True",
        f"reward_model.model.path={classifier_dir}",
        "reward_model.use_reward_loop=False",
    )
    cfg = make_config("grpo_tiny", *legacy)
    assert "use_reward_loop=False" in errors_of(cfg)["reward_model.micro_batch_size_per_gpu"]
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(*args, **kwargs):\n    return 1.0\n")
    cfg = make_config(
        "grpo_tiny", *rm_overrides(classifier_dir, f"custom_reward_function.path={reward}")
    )
    assert "reward.components=" in errors_of(cfg)["reward.components"]


class Samples(Recorder):
    def __init__(self) -> None:
        self.samples = []

    def on_samples(self, step, samples):
        self.samples.extend(samples)


def test_a_training_step_is_rewarded_by_the_model_and_validation_by_the_rule(
    make_config, classifier_dir
):
    recorder = Samples()
    config = make_config(
        "grpo_tiny",
        *rm_overrides(
            classifier_dir,
            "trainer.total_training_steps=1",
            "trainer.val_before_train=True",
            "data.val_max_samples=8",
        ),
    )
    PPOTrainer(config, recorder=recorder).train()
    train = [s for s in recorder.samples if s.split == "train"]
    val = [s for s in recorder.samples if s.split == "val"]
    assert train and val
    rewards = [s.reward for s in train]
    assert rewards == pytest.approx([s.reward_parts["score/reward_model"] for s in train])
    assert any(r not in (0.0, 1.0) for r in rewards)  # the model's logits, not the rule's 1/0
    # Validation scores with the rule, as verl's val_reward_fn: held-out accuracy stays accuracy.
    assert {s.reward for s in val} <= {0.0, 1.0}
    assert all("score/reward_model" not in s.reward_parts for s in val)


class ValAccuracy(Recorder):
    def __init__(self) -> None:
        self.accuracy: dict[int, float] = {}

    def on_step(self, step, metrics):
        if VAL_KEY in metrics:
            self.accuracy[step] = metrics[VAL_KEY]


VAL_KEY = "val-core/tiny_arithmetic/reward/mean@1"


@pytest.mark.slow
def test_grpo_learns_to_add_from_the_tiny_reward_model_alone(tiny_assets, tmp_path):
    # grpo_tiny_rm: the reward model on and no reward.components, so its score alone is the
    # reward (verl's rule); held-out accuracy is still the rule's (validation leaves the model
    # out), so it measures real learning.
    from engine.config import load_config

    config = load_config(
        "grpo_tiny_rm.yaml",
        overrides=[
            "trainer.total_training_steps=50",
            "trainer.test_freq=50",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ],
    )
    assert config.reward_model.enable and config.reward.components == []
    recorder = ValAccuracy()
    PPOTrainer(config, recorder=recorder).train()
    start, end = recorder.accuracy[0], recorder.accuracy[50]
    assert end >= start + 0.12, recorder.accuracy


def test_a_training_step_judged_by_the_tiny_model_records_each_reply(make_config):
    # reward_model.judge.prompt_template: the tiny model judges; its reply reaches each sample.
    recorder = Samples()
    config = make_config(
        "grpo_tiny",
        "reward_model.enable=True",
        "reward_model.model.path=tiny://model",
        "reward_model.judge.prompt_template='{response}+0='",
        "reward_model.rollout.response_length=4",
        "reward_model.rollout.prompt_length=32",
        "trainer.total_training_steps=1",
    )
    PPOTrainer(config, recorder=recorder).train()
    train = [s for s in recorder.samples if s.split == "train"]
    assert train
    for s in train:
        text = s.reward_parts["reward_model/judge_text"]
        if s.reward_error is None:
            assert s.reward == s.reward_parts["score/reward_model"] == float(text)
        else:  # a reply with no number is the sample's error, its text kept
            assert s.reward_error.startswith("JudgeParseError") and s.reward == 0.0
