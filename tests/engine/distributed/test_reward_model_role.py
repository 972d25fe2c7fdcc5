"""The reward model as a role on the ranks (``trainer.controller=ray``), as verl's RewardModelWorker.

On CPU ranks (gloo) the FSDP2-sharded classifier scores as the single-process
``RewardModelScorer`` does; a GRPO run is rewarded by the ranks and never loads the model in the
driver; ``reward_model.enable_resource_pool`` gives the role a pool of its own.

Keys named here, each with a test that fails if it were ignored: reward_model.enable_resource_pool,
reward_model.n_gpus_per_node, reward_model.nnodes, reward_model.model.fsdp_config.fsdp_size,
reward_model.model.fsdp_config.reshard_after_forward and
reward_model.model.fsdp_config.param_offload.
"""

from __future__ import annotations

import os
import signal

import pytest

from engine.config.schema import PPOConfig
from engine.distributed.channel import RankChannelError
from engine.distributed.worker_group import (
    RayWorkerGroup,
    ResourcePool,
    RewardModelGroup,
    split_rows,
)
from engine.rewards.reward_model import RewardModelScorer
from engine.roles.model_loading import load_reward_model
from engine.tiny.recipe import ModelShape
from engine.tiny.reward_model import build_classifier
from engine.tiny.tokenizer import build_tokenizer
from engine.trainer import Recorder
from engine.trainer.build import build_reward_scorer
from engine.trainer.ray_trainer import RayPPOTrainer
from tests.engine.distributed.helpers import ray_config

ray = pytest.importorskip("ray")

# Prompt texts and chat messages (verl's raw_prompt), five pairs: two ranks get three each, the
# last a repeat of the first.
PROMPTS = [
    "1+2=",
    [{"role": "user", "content": "13+4="}],
    "5+60=",
    [{"role": "user", "content": "7+8="}],
    "9+10=",
]
RESPONSES = ["3", "17", "65", "14", "99"]
SMALL = ModelShape(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """Save a random two-layer one-label Qwen2 classifier with the tiny tokenizer."""
    tokenizer = build_tokenizer()
    folder = tmp_path_factory.mktemp("reward_model")
    build_classifier(tokenizer, seed=1, shape=SMALL).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def rm_config(folder, **fsdp: object) -> PPOConfig:
    config = PPOConfig()
    rm = config.reward_model
    rm.enable, rm.model.path, rm.micro_batch_size_per_gpu = True, str(folder), 2
    for key, value in fsdp.items():
        setattr(rm.model.fsdp_config, key, value)
    return config


def embedding_layout(group: RayWorkerGroup) -> list[tuple[bool, int, int]]:
    """Return, per rank, whether the classifier's embedding is a DTensor (sharded, not gathered),
    the rows this rank holds and the rows of the whole embedding."""

    def layout(worker):
        from torch.distributed.tensor import DTensor

        weight = worker.roles["reward_model"].scorer.model.model.embed_tokens.weight
        sharded = isinstance(weight, DTensor)
        local = weight.to_local() if sharded else weight
        return sharded, local.shape[0], weight.shape[0]

    return ray.get([w.__ray_call__.remote(layout) for w in group.workers])


def test_split_rows_pads_with_rows_from_the_start_and_keeps_order():
    assert split_rows(list("abcde"), 2) == ([["a", "b", "c"], ["d", "e", "a"]], 1)
    assert split_rows(["a"], 3) == ([["a"], ["a"], ["a"]], 2)
    assert split_rows(list("abcd"), 2) == ([["a", "b"], ["c", "d"]], 0)
    with pytest.raises(ValueError, match="empty"):
        split_rows([], 2)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_role_scores_as_the_single_process_scorer(ray_session, classifier_dir, ranks):
    config = rm_config(classifier_dir)
    expected = load_reward_model(config).score(PROMPTS, RESPONSES)
    assert len({round(s, 4) for s in expected}) == len(expected)  # so the order is checked
    group = RayWorkerGroup(ResourcePool(f"rm_{ranks}", (ranks,), "cpu", cpus_per_rank=0.5))
    try:
        reward_model = RewardModelGroup(group, config)
        scores = reward_model.score(PROMPTS, RESPONSES)
        assert reward_model.score([], []) == []
        layout = embedding_layout(group)
    finally:
        group.shutdown()
    assert scores == pytest.approx(expected, abs=1e-5)
    if ranks == 1:  # one fp32 rank has nothing to shard: the plain classifier
        assert layout == [(False, layout[0][2], layout[0][2])]
    else:  # each rank holds part of the rows, sharded again after the forward
        assert all(sharded and local < whole for sharded, local, whole in layout)
        assert sum(local for _, local, _ in layout) == layout[0][2]


@pytest.mark.slow
def test_fsdp_size_and_reshard_after_forward_reach_the_shards(ray_session, classifier_dir):
    # reward_model.model.fsdp_config.fsdp_size=1: shards of one rank, replicated over two (HSDP),
    # so each rank holds every row; reshard_after_forward=False: the gathered weights stay.
    config = rm_config(classifier_dir, fsdp_size=1, reshard_after_forward=False)
    expected = load_reward_model(config).score(PROMPTS, RESPONSES)
    group = RayWorkerGroup(ResourcePool("rm_hsdp", (2,), "cpu", cpus_per_rank=0.5))
    try:
        reward_model = RewardModelGroup(group, config)
        before = embedding_layout(group)
        scores = reward_model.score(PROMPTS, RESPONSES)
        after = embedding_layout(group)
    finally:
        group.shutdown()
    assert all(sharded and local == whole for sharded, local, whole in before)
    assert all(not sharded for sharded, _, _ in after)
    assert scores == pytest.approx(expected, abs=1e-5)


# -- the role in a run ---------------------------------------------------------------------------


class Samples(Recorder):
    def __init__(self) -> None:
        self.samples: list = []

    def on_samples(self, step, samples):
        self.samples.extend(samples)


# The tiny GRPO preset with no validation and two responses a prompt: the runs of this file.
NO_VALIDATION_TWO_SAMPLES = (
    "data.val_files=null",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "actor_rollout_ref.rollout.n=2",
)


def run_config(assets, classifier_dir, tmp_path, *overrides: str) -> PPOConfig:
    return ray_config(
        assets,
        tmp_path,
        "grpo_tiny",
        *NO_VALIDATION_TWO_SAMPLES,
        "reward_model.enable=True",
        f"reward_model.model.path={classifier_dir}",
        "reward_model.micro_batch_size_per_gpu=2",
        *overrides,
    )


@pytest.mark.slow
def test_grpo_is_rewarded_by_the_ranks_and_the_driver_never_loads_the_model(
    ray_session, assets, classifier_dir, tmp_path, monkeypatch
):
    built = []  # every RewardModelScorer made in this (the driver's) process
    init = RewardModelScorer.__init__

    def counting(self, *args, **kwargs):
        built.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(RewardModelScorer, "__init__", counting)
    calls = []  # what the proxy was asked and answered
    score = RewardModelGroup.score

    def recording(self, prompts, responses):
        scores = score(self, prompts, responses)
        calls.append((list(prompts), list(responses), scores))
        return scores

    monkeypatch.setattr(RewardModelGroup, "score", recording)
    config = run_config(assets, classifier_dir, tmp_path, "trainer.total_training_steps=2")
    recorder = Samples()
    trainer = RayPPOTrainer(config, recorder)
    assert isinstance(trainer.reward_model, RewardModelGroup)
    assert trainer.reward_model.group is trainer.worker_groups["global_pool"]  # beside the actor
    assert trainer.fit() == "succeeded"
    assert built == []
    rewards = sorted(s.reward for s in recorder.samples)
    assert len(rewards) == 2 * 4 * 2 and len(calls) == 2  # one call per step
    assert rewards == pytest.approx(sorted(s for *_, scores in calls for s in scores), abs=1e-6)
    assert any(r not in (0.0, 1.0) for r in rewards)  # the model's logits, not the rule's 1/0
    local = load_reward_model(config)
    for prompts, responses, scores in calls:
        assert isinstance(prompts[0], list)  # verl's raw_prompt messages reached the ranks
        assert local.score(prompts, responses) == pytest.approx(scores, abs=1e-5)


@pytest.mark.slow
def test_enable_resource_pool_gives_the_reward_model_its_own_pool(
    ray_session, assets, classifier_dir, tmp_path
):
    config = run_config(
        assets,
        classifier_dir,
        tmp_path,
        "reward_model.enable_resource_pool=True",
        "reward_model.n_gpus_per_node=1",
        "reward_model.nnodes=1",
        "trainer.total_training_steps=1",
    )
    trainer = RayPPOTrainer(config, Samples())
    try:
        groups = trainer.worker_groups
        assert {name: group.world_size for name, group in groups.items()} == {
            "global_pool": 2,
            "reward_pool": 1,
        }
        assert trainer.reward_model.group is groups["reward_pool"]
        roles = {
            name: ray.get([w.__ray_call__.remote(lambda w: sorted(w.roles)) for w in g.workers])
            for name, g in groups.items()
        }
        assert roles == {
            "global_pool": [["actor_rollout_ref"], ["actor_rollout_ref"]],
            "reward_pool": [["reward_model"]],
        }
        expected = load_reward_model(config).score(PROMPTS, RESPONSES)
        assert trainer.reward_model.score(PROMPTS, RESPONSES) == pytest.approx(expected, abs=1e-5)
        # A reward rank that dies ends the run, though the reward manager turns a scorer's
        # error into failed samples: on a pool of its own nothing else would notice.
        pid = groups["reward_pool"].pids[0]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RankChannelError, match=rf"rank 0 \(pid {pid}\)"):
            trainer.fit()
    finally:
        trainer.shutdown()


@pytest.mark.slow
def test_param_offload_of_the_reward_model_on_cpu_ranks_fails_before_any_actor_starts(
    ray_session, assets, classifier_dir, tmp_path
):
    config = run_config(
        assets, classifier_dir, tmp_path, "reward_model.model.fsdp_config.param_offload=True"
    )
    with pytest.raises(ValueError, match=r"reward_model\.model\.fsdp_config\.param_offload=True"):
        RayPPOTrainer(config)


def test_an_own_reward_pool_needs_the_ray_controller_and_offload_a_gpu(
    assets, classifier_dir, tmp_path
):
    # reward_model.nnodes defaults to 0 (verl's default): a pool of no ranks.
    config = run_config(assets, classifier_dir, tmp_path, "reward_model.enable_resource_pool=True")
    with pytest.raises(ValueError, match=r"reward_model\.nnodes x reward_model\.n_gpus_per_node"):
        RayPPOTrainer(config)
    # The single-process trainer loads the model whole in its own process.
    config.trainer.controller = "local"
    with pytest.raises(ValueError, match="enable_resource_pool=True: read where"):
        build_reward_scorer(config)
    config.reward_model.enable_resource_pool = False
    config.reward_model.model.fsdp_config.param_offload = True  # honoured on a GPU only
    with pytest.raises(ValueError, match="fsdp_config.param_offload=True: keeps the reward model"):
        build_reward_scorer(config)


@pytest.mark.slow
def test_a_generative_judge_scores_in_the_driver_while_the_ranks_train(
    ray_session, assets, tmp_path
):
    # The judge generates in the single controller's process; no reward-model role starts.
    config = ray_config(
        assets,
        tmp_path,
        "grpo_tiny",
        *NO_VALIDATION_TWO_SAMPLES,
        "trainer.total_training_steps=1",
        "reward_model.enable=True",
        "reward_model.model.path=tiny://model",
        "reward_model.judge.prompt_template='{response}+0='",
        "reward_model.rollout.response_length=4",
        "reward_model.rollout.prompt_length=32",
    )
    recorder = Samples()
    trainer = RayPPOTrainer(config, recorder)
    assert trainer.reward_model is None and set(trainer.worker_groups) == {"global_pool"}
    assert trainer.fit() == "succeeded"
    assert len(recorder.samples) == 4 * 2
    for s in recorder.samples:
        text = s.reward_parts["reward_model/judge_text"]
        if s.reward_error is None:
            assert s.reward == float(text)
        else:  # a reply with no number is the sample's error, its text kept
            assert s.reward_error.startswith("JudgeParseError") and s.reward == 0.0
