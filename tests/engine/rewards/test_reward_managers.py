"""verl's batch and prime reward managers: one call per batch, and per-sample timeouts in worker
processes that survive a hung or crashing reward function; both selected by
``reward_model.reward_manager`` in a one-step tiny GRPO run."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest
import torch

from engine.config import load_config, validate_config
from engine.config.fields import ConfigValidationError
from engine.config.reward_kwargs import reward_kwargs_problems
from engine.rewards.batch_manager import BatchRewardManager
from engine.rewards.custom import load_custom_reward_fn
from engine.rewards.managers import REWARD_MANAGER_CLASSES
from engine.rewards.names import REWARD_MANAGERS
from engine.rewards.prime import DEFAULT_TIMEOUT_S, PrimeRewardManager
from engine.trainer.reporting import Recorder
from tests.engine.rewards.test_manager import RESPONSE_LEN, make_batch
from tests.engine.tiny_run import short_run

ROWS = [
    {"data_source": "exact_match", "response": "12", "ground_truth": "12"},  # 3 tokens with EOS
    {"data_source": "dict", "response": "abcde", "ground_truth": "x"},  # 6
    {"data_source": "exact_match", "response": "no", "ground_truth": "yes", "extra_info": {"k": 1}},
]

# A per-response function for the prime manager: "sleep" hangs, "crash" kills its process.
PRIME_REWARD = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("sleep"):
        with open(extra_info["pid_file"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
    if solution_str.startswith("nap"):
        time.sleep(1.0)
    if solution_str == "crash":
        os._exit(3)
    return 1.0 if solution_str == ground_truth else 0.25
"""


def test_every_reward_manager_name_has_its_class():
    assert tuple(REWARD_MANAGER_CLASSES) == REWARD_MANAGERS
    assert REWARD_MANAGERS == ("naive", "dapo", "prime", "batch", "remote")


# -- batch ---------------------------------------------------------------------------------------
def test_the_batch_function_is_called_once_for_the_whole_batch(char_tokenizer):
    calls = []

    def compute_score(data_sources, solution_strs, ground_truths, extra_infos, scale):
        calls.append((data_sources, solution_strs, ground_truths, extra_infos, scale))
        return [
            {"score": scale * 0.5, "length": len(s)} if source == "dict" else scale * (s == truth)
            for source, s, truth in zip(data_sources, solution_strs, ground_truths, strict=True)
        ]

    manager = BatchRewardManager(char_tokenizer, compute_score=compute_score, scale=2.0)
    out = manager(make_batch(char_tokenizer, ROWS), return_dict=True)
    assert calls == [
        (
            ["exact_match", "dict", "exact_match"],
            ["12", "abcde", "no"],
            ["12", "x", "yes"],
            [None, None, {"k": 1}],
            2.0,  # reward_model.reward_kwargs reach the function
        )
    ]
    expected = torch.zeros(3, RESPONSE_LEN)
    expected[0, 2], expected[1, 5] = 2.0, 1.0  # each score on its response's last valid token
    assert torch.equal(out["reward_tensor"], expected)
    info = out["reward_extra_info"]
    assert info["score"] == [2.0, 1.0, 0.0]
    assert info["length"] == [None, 5, None]  # a dict's other keys, None where a response lacks it
    assert info["reward_error"] == [None] * 3
    assert out["meta_info"] == {"reward_failed": 0}
    manager(make_batch(char_tokenizer, ROWS[:2]))
    assert len(calls) == 2 and calls[1][1] == ["12", "abcde"]


def test_a_batch_function_may_return_an_array(char_tokenizer):
    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        return np.array([0.5, 1.5, -1.0], dtype=np.float32)

    out = BatchRewardManager(char_tokenizer, compute_score=compute_score)(
        make_batch(char_tokenizer, ROWS), return_dict=True
    )
    assert out["reward_extra_info"]["score"] == [0.5, 1.5, -1.0]


def wrong_length(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0, 0.0]


def junk_entry(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0, "high", 0.0]


def no_list(data_sources, solution_strs, ground_truths, extra_infos):
    return 1.0


def no_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [{"acc": 1.0}] * len(data_sources)


@pytest.mark.parametrize(
    ("fn", "error", "words"),
    [
        (wrong_length, ValueError, "wrong_length returned 2 scores for 3 responses ([1.0, 0.0])"),
        (junk_entry, TypeError, "junk_entry returned 'high' for response 1"),
        (no_list, TypeError, "no_list returned 1.0 (float) for 3 responses"),
        (no_score, TypeError, "without a 'score' key (keys: ['acc'])"),
    ],
)
def test_a_batch_result_of_the_wrong_shape_stops_the_run_naming_the_function(
    char_tokenizer, fn, error, words
):
    manager = BatchRewardManager(char_tokenizer, compute_score=fn)
    with pytest.raises(error) as caught:
        manager(make_batch(char_tokenizer, ROWS))
    assert f"the batch reward function {fn.__name__} returned " in str(caught.value)
    assert words in str(caught.value)


def test_a_raising_batch_function_fails_every_response_of_that_batch(char_tokenizer):
    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        raise ConnectionError("the verifier is down")

    out = BatchRewardManager(char_tokenizer, compute_score=compute_score)(
        make_batch(char_tokenizer, ROWS), return_dict=True
    )
    assert out["reward_extra_info"]["reward_error"] == ["ConnectionError: the verifier is down"] * 3
    assert out["reward_extra_info"]["score"] == [0.0] * 3
    assert out["meta_info"] == {"reward_failed": 3}
    assert out["reward_tensor"].abs().sum().item() == 0.0


def test_the_batch_manager_refuses_what_it_cannot_call(char_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="set custom_reward_function.path and .name"):
        BatchRewardManager(char_tokenizer)
    path = tmp_path / "per_response.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1):\n"
        "    return 1.0\n"
    )
    with pytest.raises(TypeError, match=r"compute_score \(.*per_response.py\) takes \(data_source"):
        BatchRewardManager(char_tokenizer, compute_score=load_custom_reward_fn(path))
    fn = load_custom_reward_fn(path, reward_kwargs={"scale": 1})
    with pytest.raises(ValueError, match="scale is set in both reward_model.reward_kwargs and"):
        BatchRewardManager(char_tokenizer, compute_score=fn, scale=2)
    with pytest.raises(ValueError, match="reward_kwargs.solution_strs is an argument the batch"):
        BatchRewardManager(char_tokenizer, compute_score=wrong_length, solution_strs=[])
    with pytest.raises(ValueError, match="reward.num_workers=2 would have no effect"):
        BatchRewardManager(char_tokenizer, compute_score=wrong_length, num_workers=2)
    with pytest.raises(ValueError, match="weighted reward.components and the reward model"):
        BatchRewardManager(char_tokenizer, compute_score=wrong_length, components=[("format", 1)])


# -- prime ---------------------------------------------------------------------------------------
@pytest.fixture
def prime_reward(tmp_path):
    path = tmp_path / "prime_reward.py"
    path.write_text(PRIME_REWARD)
    return load_custom_reward_fn(path)


def prime_rows(tmp_path, responses: list[str]) -> list[dict]:
    extra = {"pid_file": str(tmp_path / "sleeper.pid")}
    return [
        {"data_source": "x", "response": r, "ground_truth": "12", "extra_info": extra}
        for r in responses
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_response_past_the_timeout_scores_0_and_the_others_score(
    char_tokenizer, prime_reward, tmp_path, workers
):
    rows = prime_rows(tmp_path, ["12", "sleep", "7", "12"])
    start = time.monotonic()
    with PrimeRewardManager(
        char_tokenizer, compute_score=prime_reward, num_workers=workers, timeout=2
    ) as manager:
        out = manager(make_batch(char_tokenizer, rows), return_dict=True)
        took = time.monotonic() - start
        info = out["reward_extra_info"]
        assert info["score"] == [1.0, 0.0, 0.25, 1.0]
        assert info["reward_error"] == [
            None,
            "TimeoutError: the reward function ran past its 2 s timeout",
            None,
            None,
        ]
        assert out["meta_info"] == {"reward_failed": 1}
        assert out["reward_tensor"][1].abs().sum().item() == 0.0
        assert took < 30  # the 60 s sleep was not waited for
        # The hung worker was killed, and the next batch gets a fresh pool.
        pid = int((tmp_path / "sleeper.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        again = manager(make_batch(char_tokenizer, rows[:1]), return_dict=True)
        assert again["reward_extra_info"]["score"] == [1.0]


def test_a_crashing_worker_fails_only_its_response_and_the_run_goes_on(
    char_tokenizer, prime_reward, tmp_path
):
    # One worker: the response being scored when the process died is the one that killed it.
    rows = prime_rows(tmp_path, ["12", "crash", "7", "12"])
    with PrimeRewardManager(char_tokenizer, compute_score=prime_reward) as manager:
        out = manager(make_batch(char_tokenizer, rows), return_dict=True)
        info = out["reward_extra_info"]
        assert info["score"] == [1.0, 0.0, 0.25, 1.0]
        assert info["reward_error"][1].startswith("BrokenProcessPool: A process in the process")
        assert [e is None for e in info["reward_error"]] == [True, False, True, True]
        assert out["meta_info"] == {"reward_failed": 1}
        again = manager(make_batch(char_tokenizer, rows[2:]), return_dict=True)
        assert again["reward_extra_info"]["score"] == [0.25, 1.0]


def test_the_timeout_counts_from_when_a_worker_starts_the_response(
    char_tokenizer, prime_reward, tmp_path
):
    # Four 1 s naps in one worker take 4 s, past the 3 s timeout, yet none waited in its own
    # clock (verl's manager would start all four clocks together).
    rows = prime_rows(tmp_path, ["nap"] * 4)
    with PrimeRewardManager(char_tokenizer, compute_score=prime_reward, timeout=3) as manager:
        out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    assert out["reward_extra_info"]["score"] == [0.25] * 4
    assert out["meta_info"] == {"reward_failed": 0}


def test_the_prime_manager_without_a_function_dispatches_by_data_source(char_tokenizer):
    rows = [
        {"data_source": "tiny_arithmetic", "response": "12", "ground_truth": "12"},
        {"data_source": "openai/gsm8k", "response": "so #### 5", "ground_truth": "6"},
    ]
    with PrimeRewardManager(char_tokenizer) as manager:
        assert manager.timeout == DEFAULT_TIMEOUT_S == 300.0  # verl's
        out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.0, 0.0]


def test_the_prime_manager_refuses_a_bad_timeout_and_components(char_tokenizer):
    for timeout in (0, -1, float("inf"), True, "10"):
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
            PrimeRewardManager(char_tokenizer, timeout=timeout)
    with pytest.raises(ValueError, match="weighted reward.components and the reward model"):
        PrimeRewardManager(char_tokenizer, components=[("format", 1.0)])
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        PrimeRewardManager(char_tokenizer, compute_score=lambda *a: 1.0)


# -- the config ----------------------------------------------------------------------------------
def errors_of(*overrides: str) -> dict[str, str]:
    try:
        validate_config(load_config("grpo_tiny", list(overrides)), check_files=False)
    except ConfigValidationError as exc:
        return {e.key: e.message for e in exc.errors}
    return {}


def test_the_validator_checks_what_prime_and_batch_score_with():
    assert errors_of("reward_model.reward_manager=prime") == {}
    assert errors_of("reward_model.reward_manager=batch") == {
        "reward_model.reward_manager": (
            "batch calls custom_reward_function once per batch; set custom_reward_function.path "
            "and .name to a function compute_score(data_sources, solution_strs, ground_truths, "
            "extra_infos, **kwargs) returning one score per response"
        )
    }
    batch = ["reward_model.reward_manager=batch", "custom_reward_function.path=/tmp/batch.py"]
    assert errors_of(*batch, "+reward_model.reward_kwargs.judge=small") == {}
    found = errors_of(
        *batch,
        "reward.num_workers=4",
        "+reward_model.reward_kwargs.ground_truths=[]",
        "+reward_model.reward_kwargs.scale=2",
        "+custom_reward_function.reward_kwargs.scale=3",
    )
    assert found.keys() == {
        "reward.num_workers",
        "reward_model.reward_kwargs.ground_truths",
        "reward_model.reward_kwargs.scale",
    }
    assert "has no effect with reward_model.reward_manager=batch" in found["reward.num_workers"]
    assert "is also set in custom_reward_function" in found["reward_model.reward_kwargs.scale"]
    for manager in ("prime", "batch"):
        found = errors_of(
            f"reward_model.reward_manager={manager}",
            "custom_reward_function.path=/tmp/fn.py",
            "reward.components=[{name: custom}]",
        )
        assert list(found) == ["reward.components"]
        assert (
            f"are not read by reward_model.reward_manager={manager}" in found["reward.components"]
        )


@pytest.mark.parametrize(
    ("manager", "kwargs", "key", "words"),
    [
        ("prime", {"timeout": 0}, "reward_kwargs.timeout", "finite number of seconds > 0"),
        ("prime", {"timeout": float("inf")}, "reward_kwargs.timeout", "finite number of seconds"),
        ("prime", {"max_resp_len": 8}, "reward_kwargs.max_resp_len", "takes only timeout"),
        ("naive", {"timeout": 5}, "reward_kwargs.timeout", "set reward_model.reward_manager=prime"),
        (
            "naive",
            {"scale": 2},
            "reward_kwargs.scale",
            "function's own keyword arguments go in custom_reward_function.reward_kwargs",
        ),
        ("batch", {"extra_infos": 1}, "reward_kwargs.extra_infos", "passes its function itself"),
    ],
)
def test_bad_reward_kwargs_of_prime_and_batch_are_named_with_the_fix(manager, kwargs, key, words):
    problems = reward_kwargs_problems(manager, kwargs)
    assert len(problems) == 1, problems
    assert problems[0][0].endswith(key) and words in problems[0][1]


# -- selected by reward_model.reward_manager in a training step ----------------------------------
BATCH_REWARD = """
def compute_score(data_sources, solution_strs, ground_truths, extra_infos, log_path):
    with open(log_path, "a") as f:
        f.write(f"{len(solution_strs)}\\n")
    return [
        {"score": 1.0 if s == truth else 0.25, "length": len(s)}
        for s, truth in zip(solution_strs, ground_truths)
    ]
"""

# The first response to claim the marker hangs; the others score as the rule would, plus 0.25.
HANGING_REWARD = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, marker=None):
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return 1.0 if solution_str == ground_truth else 0.25
    time.sleep(60)
"""


class Run(Recorder):
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.samples: list = []

    def on_step(self, step, metrics):
        self.metrics = metrics

    def on_samples(self, step, samples):
        self.samples.extend(samples)


def train_one_step(tmp_path, *overrides: str) -> tuple[Run, object]:
    from engine.trainer.ppo_trainer import PPOTrainer

    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            *short_run(tmp_path),
            *overrides,
        ],
    )
    run = Run()
    trainer = PPOTrainer(config, recorder=run)
    assert trainer.fit() == "succeeded"
    assert multiprocessing.active_children() == []  # fit shut the reward workers down
    return run, trainer


def test_reward_manager_batch_scores_a_training_step_in_one_call(tiny_assets, tmp_path):
    path, log = tmp_path / "batch_reward.py", tmp_path / "calls.log"
    path.write_text(BATCH_REWARD)
    run, trainer = train_one_step(
        tmp_path,
        "reward_model.reward_manager=batch",
        f"custom_reward_function.path={path}",
        f"+reward_model.reward_kwargs.log_path={log}",
    )
    assert isinstance(trainer.reward_fn, BatchRewardManager)
    n = trainer.config.actor_rollout_ref.rollout.n
    assert log.read_text().split() == [str(4 * n)]  # one call for the step's 4 x n responses
    assert len(run.samples) == 4 * n
    for sample in run.samples:
        right = sample.response_text == sample.ground_truth
        assert sample.reward == (1.0 if right else 0.25)
        assert sample.reward_parts["length"] == len(sample.response_text)


def test_reward_manager_prime_times_out_a_hung_response_in_a_training_step(tiny_assets, tmp_path):
    path = tmp_path / "hanging_reward.py"
    path.write_text(HANGING_REWARD)
    start = time.monotonic()
    run, trainer = train_one_step(
        tmp_path,
        "reward_model.reward_manager=prime",
        "+reward_model.reward_kwargs.timeout=5",
        "reward.num_workers=2",
        f"custom_reward_function.path={path}",
        f"+custom_reward_function.reward_kwargs.marker={tmp_path / 'marker'}",
    )
    assert time.monotonic() - start < 55  # the 60 s sleep was cut short
    assert isinstance(trainer.reward_fn, PrimeRewardManager) and trainer.reward_fn.timeout == 5
    failed = [s for s in run.samples if s.reward_error]
    assert [s.reward_error for s in failed] == [
        "TimeoutError: the reward function ran past its 5 s timeout"
    ]
    assert failed[0].reward == 0.0 and run.metrics["reward/failed"] == 1.0
    for sample in run.samples:
        if not sample.reward_error:
            assert sample.reward == (1.0 if sample.response_text == sample.ground_truth else 0.25)


def test_a_finished_run_leaves_no_reward_worker_processes(tiny_assets, tmp_path):
    _, trainer = train_one_step(
        tmp_path, "reward_model.reward_manager=prime", "reward.num_workers=2"
    )
    assert trainer.reward_fn.num_workers == 2
    assert multiprocessing.active_children() == []
