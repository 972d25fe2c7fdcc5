"""verl's interaction YAML (``multi_turn.interaction_config_path``) on the embedded tiny model.

The interaction classes below are the YAML's ``class_name`` targets
(``tests.engine.rollout.test_interactions.<Class>``). The tiny model (``tiny://model``) answers
each arithmetic prompt greedily in a few tokens ending with EOS; what it answers does not matter
here, only who speaks when and which tokens the loss sees.
"""

from __future__ import annotations

import asyncio
import logging
import math
import textwrap
import threading
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import RolloutConfig, load_config
from engine.config.fields import ConfigValidationError
from engine.config.validate import validate_config
from engine.data import DataProto
from engine.rewards import RewardManager
from engine.roles.actor_rollout_ref import get_rollout
from engine.rollout.hf import HFRollout
from engine.rollout.interactions import Interactions, load_interaction_config
from engine.rollout.multi_turn import MultiTurnRollout
from engine.tools.base import DEFAULT_TIMEOUT_S
from tests.engine.tiny_run import short_run

HERE = "tests.engine.rollout.test_interactions"
GREEDY = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}
KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class RetryInteraction:
    """verl-style: asks to try again (score 0.25) until ``config.rounds`` answers, then ends
    (score 1.0). Keeps what each call received, so the tests can check it."""

    def __init__(self, config):
        self.config = config
        self.started: dict[str, dict] = {}
        self.calls: list[tuple[str, list[dict], dict]] = []
        self.finalized: list[str] = []

    async def start_interaction(self, instance_id=None, **kwargs):
        self.started[instance_id] = kwargs
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.calls.append((instance_id, messages, kwargs))
        messages.append({"role": "user", "content": "mutated"})  # must not reach the rollout
        answers = sum(m["role"] == "assistant" for m in messages)
        if answers < self.config["rounds"]:
            return False, self.config.get("again", "again"), 0.25, {}
        return True, "done", 1.0, {"answers": answers}

    async def calculate_score(self, instance_id, **kwargs):  # verl's loop never calls it
        raise AssertionError("calculate_score is the interaction's own business")

    async def finalize_interaction(self, instance_id, **kwargs):
        self.finalized.append(instance_id)


class EchoInteraction:
    """Plain (not async) methods, as a user might write them: replies with its own name and
    ends after one reply, without a score; BaseInteraction's finalize takes no instance id."""

    def __init__(self, config):
        self.name = config["name"]
        self.finalized = 0

    def start_interaction(self, instance_id=None, **kwargs):
        return instance_id

    def generate_response(self, instance_id, messages, **kwargs):
        if sum(m["role"] == "assistant" for m in messages) > 1:
            return True, "", None, {}
        return False, self.name, None, {}

    def finalize_interaction(self):
        self.finalized += 1


class RaisingInteraction:
    """Fails where ``config.where`` says: raises, returns junk, or fails to clean up."""

    def __init__(self, config):
        self.where = config["where"]

    async def start_interaction(self, instance_id=None, **kwargs):
        if self.where == "start_interaction":
            raise ConnectionError("simulator offline")
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        if self.where == "generate_response":
            raise RuntimeError("no simulator")
        replies = {"junk": (False, "hi", 0.0), "nan": (False, "hi", math.nan, {})}
        return replies.get(self.where, (True, "bye", None, {}))

    async def finalize_interaction(self, instance_id, **kwargs):
        if self.where == "finalize_interaction":
            raise RuntimeError("cleanup failed")


RELEASE = threading.Event()  # set at teardown: stalled calls return and their threads end
STALL_S = 30.0  # how long a stalled call would take; a rollout must not wait for it


class SleepingInteraction:
    """A plain method that, for a sample whose kwargs say ``stall``, blocks its thread; every
    other sample gets "fine" (score 1.0) and the conversation ends."""

    def __init__(self, config):
        pass

    def generate_response(self, instance_id, messages, stall=False, **kwargs):
        if stall:
            RELEASE.wait(STALL_S)
        return True, "fine", 1.0, {}


class AwaitingInteraction:
    """Async, as verl's are: a stalled sample awaits a reply that takes too long."""

    def __init__(self, config):
        pass

    async def generate_response(self, instance_id, messages, stall=False, **kwargs):
        if stall:
            await asyncio.sleep(STALL_S)
        return True, "fine", 1.0, {}


class LoopBlockingInteraction:
    """Async but blocking: a stalled sample sleeps without awaiting, so the event loop stops."""

    def __init__(self, config):
        pass

    async def generate_response(self, instance_id, messages, stall=False, **kwargs):
        if stall:
            RELEASE.wait(STALL_S)  # time.sleep in an async def: nothing else on the loop runs
        return True, "fine", 1.0, {}


class StallingLifecycle:
    """Stalls in ``start_interaction`` (async, awaiting) or ``finalize_interaction`` (plain,
    blocking its thread) for the sample whose kwargs say ``stall`` is that one."""

    def __init__(self, config):
        self.stalls: dict[str, str | None] = {}

    async def start_interaction(self, instance_id, stall=None, **kwargs):
        self.stalls[instance_id] = stall
        if stall == "start":
            await asyncio.sleep(STALL_S)

    async def generate_response(self, instance_id, messages, **kwargs):
        return True, "fine", None, {}

    def finalize_interaction(self, instance_id):
        if self.stalls[instance_id] == "finalize":
            RELEASE.wait(STALL_S)


class NoResponseMethod:
    def __init__(self, config):
        pass


class BrokenInit(EchoInteraction):
    def __init__(self, config):
        raise KeyError("api_key")


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny import ensure_tiny_assets

    folder = ensure_tiny_assets().model_dir
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.fixture
def release():
    """Let this test's stalled calls return once it is over (their threads are daemons)."""
    RELEASE.clear()
    yield
    RELEASE.set()


def write_yaml(folder, entries: str):
    path = folder / "interaction.yaml"
    path.write_text("interaction:\n" + textwrap.indent(textwrap.dedent(entries), "  "))
    return path


def rollout_config(yaml_path, **multi_turn) -> RolloutConfig:
    config = RolloutConfig()
    config.multi_turn.enable = True
    config.multi_turn.interaction_config_path = str(yaml_path)
    for key, value in multi_turn.items():
        setattr(config.multi_turn, key, value)
    return config


def prompts(tokenizer, questions, kwargs):
    messages = [[{"role": "user", "content": q}] for q in questions]
    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        for m in messages
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    extra = [{"index": i, **({"interaction_kwargs": k} if k else {})} for i, k in enumerate(kwargs)]
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
        {
            "raw_prompt": messages,
            "data_source": ["tiny"] * len(questions),
            "reward_model": [{"ground_truth": "0"} for _ in questions],
            "extra_info": extra,
        },
    )


def ids_of(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def generate(rollout, batch, budget=64):
    return rollout.generate_sequences(batch, max_new_tokens=budget, sampling=GREEDY)


def spans(mask: list[int]) -> list[tuple[int, int]]:
    """Return the (value, length) runs of a 0/1 mask."""
    runs: list[tuple[int, int]] = []
    for value in mask:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs


# -- the conversation --------------------------------------------------------------------------
def test_a_yaml_interaction_answers_ends_the_conversation_and_its_scores_reach_the_reward(
    tiny, tmp_path
):
    model, tokenizer = tiny
    path = write_yaml(
        tmp_path, f"- {{name: retry, class_name: {HERE}.RetryInteraction, config: {{rounds: 2}}}}\n"
    )
    rollout = get_rollout("hf", model, tokenizer, rollout_config(path))
    assert isinstance(rollout, MultiTurnRollout)
    kwargs = [{"name": "retry", "ground_truth": "47"}, {"name": "retry", "ground_truth": "56"}]
    batch = prompts(tokenizer, ["12+35=", "7*8="], kwargs)
    out = generate(rollout, batch)

    interaction = rollout.interactions.by_name["retry"]
    assert interaction.config == {"rounds": 2, "name": "retry"}  # verl injects the name
    # verl's interaction_kwargs reach start_interaction and every generate_response.
    assert sorted(k["ground_truth"] for k in interaction.started.values()) == ["47", "56"]
    assert [c[2]["ground_truth"] for c in interaction.calls] == ["47", "56", "47", "56"]
    assert sorted(interaction.finalized) == sorted(interaction.started)  # each one, once

    nt, b = out.non_tensor_batch, out.batch
    again = ids_of(tokenizer, "<|user|>again<|assistant|>")
    for i in range(2):
        # answer (policy) | "again" (interaction, masked) | answer (policy); "done" ended it.
        roles = [m["role"] for m in nt["messages"][i]]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert nt["messages"][i][2] == {"role": "user", "content": "again"}  # not "mutated"
        width = int(b["attention_mask"][i, b["prompts"].shape[1] :].sum())
        mask = b["response_mask"][i, :width].tolist()
        first, user, second = spans(mask)
        assert first[0] == 1 and user == (0, len(again)) and second[0] == 1
        start = first[1]
        assert b["responses"][i, start : start + len(again)].tolist() == again
        assert b["responses"][i, width - 1].item() == tokenizer.eos_token_id
        assert b["rollout_log_probs"][i, start : start + len(again)].tolist() == [0.0] * len(again)
    assert nt["num_turns"].tolist() == [2, 2]
    assert nt["turn_scores"].tolist() == [[0.25, 1.0], [0.25, 1.0]]
    assert nt["interaction_errors"].tolist() == [[], []]
    assert nt["truncated"].tolist() == [False, False]
    last = nt["turns"][0][-1]
    assert last == {"role": "user", "content": "done", "score": 1.0, "ends": True}
    assert nt["turns"][0][1] == {"role": "user", "content": "again", "score": 0.25}

    # verl's reward loop hands the rollout's turn_scores to the reward function in extra_info.
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return sum(extra_info["turn_scores"])

    rewards = RewardManager(tokenizer, compute_score=compute_score)(out.union(_rows(batch)))
    for i in range(2):
        last_assistant = int(b["response_mask"][i].nonzero().max())
        assert rewards[i, last_assistant].item() == pytest.approx(1.25)
        assert rewards[i].sum().item() == pytest.approx(1.25)
    assert seen[0]["index"] == 0 and seen[0]["turn_scores"] == [0.25, 1.0]
    assert "turn_scores" not in batch.non_tensor_batch["extra_info"][0]  # the row is not changed


def _rows(batch: DataProto) -> DataProto:
    """Return the prompt rows' reward columns (no tensors) to join with a rollout."""
    keep = ["data_source", "reward_model", "extra_info"]
    return DataProto.from_dict({}, {k: batch.non_tensor_batch[k] for k in keep})


def test_each_sample_talks_to_the_interaction_its_kwargs_name(tiny, tmp_path):
    model, tokenizer = tiny
    path = write_yaml(
        tmp_path,
        f"""\
        - {{name: alpha, class_name: {HERE}.EchoInteraction}}
        - {{name: beta, class_name: {HERE}.EchoInteraction}}
        - {{class_name: {HERE}.RetryInteraction, config: {{rounds: 2, again: retried}}}}
        """,
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(path).multi_turn
    )
    assert sorted(rollout.interactions.by_name) == ["alpha", "beta", "retry"]  # verl's default
    names = ["beta", "alpha", "retry", "beta"]
    out = generate(
        rollout, prompts(tokenizer, ["1+1=", "2+2=", "3+3=", "4+4="], [{"name": n} for n in names])
    )
    replies = [m[2]["content"] for m in out.non_tensor_batch["messages"]]
    assert replies == ["beta", "alpha", "retried", "beta"]
    # Echo ends without a score; only the retry sample has turn scores.
    assert out.non_tensor_batch["turn_scores"].tolist() == [[], [], [0.25, 1.0], []]
    assert rollout.interactions.by_name["beta"].finalized == 2  # finalize() without an id


def test_the_only_interaction_is_the_default_and_several_need_a_name(tiny, tmp_path):
    model, tokenizer = tiny
    one = write_yaml(
        tmp_path, f"- {{name: retry, class_name: {HERE}.RetryInteraction, config: {{rounds: 2}}}}\n"
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(one).multi_turn
    )
    out = generate(rollout, prompts(tokenizer, ["1+1="], [None]))
    assert out.non_tensor_batch["turn_scores"].tolist() == [[0.25, 1.0]]

    two = write_yaml(
        tmp_path,
        f"""\
        - {{name: alpha, class_name: {HERE}.EchoInteraction}}
        - {{name: beta, class_name: {HERE}.EchoInteraction}}
        """,
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(two).multi_turn
    )
    with pytest.raises(ValueError, match=r"row 1 names no interaction .* \['alpha', 'beta'\]"):
        generate(rollout, prompts(tokenizer, ["1+1=", "2+2="], [{"name": "alpha"}, None]))
    with pytest.raises(ValueError, match=r"asks for interaction 'gamma' .* \['alpha', 'beta'\]"):
        generate(rollout, prompts(tokenizer, ["1+1="], [{"name": "gamma"}]))


# -- failures at run time: recorded, the run goes on ---------------------------------------------
@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("generate_response", "generate_response failed: RuntimeError: no simulator"),
        ("junk", "generate_response failed: ValueError: generate_response must return"),
        ("nan", "generate_response failed: ValueError: its score must be a finite number"),
    ],
)
def test_an_interaction_that_raises_or_returns_junk_ends_its_conversation_with_an_error(
    tiny, tmp_path, where, error
):
    model, tokenizer = tiny
    path = write_yaml(
        tmp_path,
        f"- {{name: bad, class_name: {HERE}.RaisingInteraction, config: {{where: {where}}}}}\n",
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(path).multi_turn
    )
    out = generate(rollout, prompts(tokenizer, ["1+1=", "2+2="], [None, None]))
    nt = out.non_tensor_batch
    assert nt["num_turns"].tolist() == [1, 1]
    assert out.batch["response_mask"].sum().item() > 0  # the policy's answers are kept
    for i in range(2):
        [recorded] = nt["interaction_errors"][i]
        assert recorded.startswith(f"interaction 'bad': {error}")
        assert nt["turns"][i][-1] == {"role": "user", "content": "", "error": recorded}


def test_a_failed_start_leaves_the_sample_without_its_interaction(tiny, tmp_path):
    model, tokenizer = tiny
    path = write_yaml(
        tmp_path,
        f"- {{name: bad, class_name: {HERE}.RaisingInteraction, "
        "config: {where: start_interaction}}\n",
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(path).multi_turn
    )
    out = generate(rollout, prompts(tokenizer, ["1+1="], [None]))
    assert out.non_tensor_batch["num_turns"].tolist() == [1]
    assert out.non_tensor_batch["interaction_errors"].tolist() == [
        ["interaction 'bad': start_interaction failed: ConnectionError: simulator offline"]
    ]


def test_a_failed_finalize_is_recorded_after_the_conversation(tiny, tmp_path):
    model, tokenizer = tiny
    path = write_yaml(
        tmp_path,
        f"- {{name: bad, class_name: {HERE}.RaisingInteraction, "
        "config: {where: finalize_interaction}}\n",
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(path).multi_turn
    )
    out = generate(rollout, prompts(tokenizer, ["1+1="], [None]))
    assert out.non_tensor_batch["turns"][0][-1] == {"role": "user", "content": "bye", "ends": True}
    assert out.non_tensor_batch["interaction_errors"].tolist() == [
        ["interaction 'bad': finalize_interaction failed: RuntimeError: cleanup failed"]
    ]


# -- time limits: a hung call is a recorded error, the rollout goes on ---------------------------
def stalling_rollout(tiny, tmp_path, class_name):
    """Return a rollout whose 'slow' interaction (``class_name``, 0.2 s) stalls for the sample
    asking it to, beside a plain 'plain' interaction, and its YAML's path."""
    model, tokenizer = tiny
    path = write_yaml(
        tmp_path,
        f"""\
        - {{name: slow, class_name: {HERE}.{class_name}, config: {{timeout_s: 0.2}}}}
        - {{name: plain, class_name: {HERE}.SleepingInteraction}}
        """,
    )
    rollout = MultiTurnRollout(
        HFRollout(model, tokenizer, None), tokenizer, rollout_config(path).multi_turn
    )
    return rollout, path


def timed_generate(rollout, tokenizer, stall: bool):
    """Return the rollout of three samples (slow, slow stalling if ``stall``, plain) and its
    seconds."""
    kwargs = [{"name": "slow"}, {"name": "slow", "stall": stall}, {"name": "plain"}]
    batch = prompts(tokenizer, ["1+1=", "2+2=", "3+3="], kwargs)
    started = time.monotonic()
    out = generate(rollout, batch)
    return out.non_tensor_batch, time.monotonic() - started


def assert_answered(nt, i):
    assert nt["interaction_errors"][i] == []
    assert nt["turns"][i][-1] == {"role": "user", "content": "fine", "score": 1.0, "ends": True}
    assert nt["turn_scores"][i] == [1.0]


def assert_timed_out(nt, i, error):
    assert nt["interaction_errors"][i] == [error]
    assert nt["turns"][i][-1] == {"role": "user", "content": "", "error": error}
    assert nt["num_turns"][i] == 1  # the conversation ends on the policy's answer


@pytest.mark.parametrize("class_name", ["SleepingInteraction", "AwaitingInteraction"])
def test_a_call_past_its_timeout_is_a_recorded_error_and_the_others_are_answered(
    tiny, tmp_path, release, class_name
):
    rollout, path = stalling_rollout(tiny, tmp_path, class_name)
    assert rollout.interactions.timeouts == {"slow": 0.2, "plain": DEFAULT_TIMEOUT_S}
    nt, seconds = timed_generate(rollout, tiny[1], stall=True)
    assert seconds < STALL_S / 3  # the rollout did not wait for the stalled call
    assert_answered(nt, 0)
    assert_timed_out(
        nt,
        1,
        f"interaction 'slow': generate_response timed out after 0.2 s; raise its "
        f"config.timeout_s in {path} or make it return sooner",
    )
    assert_answered(nt, 2)


def test_an_async_call_that_blocks_the_loop_times_out_and_a_new_loop_serves_the_next(
    tiny, tmp_path, release, caplog
):
    rollout, path = stalling_rollout(tiny, tmp_path, "LoopBlockingInteraction")
    blocked = (
        "interaction 'slow': generate_response timed out after 0.2 s while the interactions' "
        "event loop was blocked (an async method that sleeps or computes without awaiting holds "
        f"up every async call); raise its config.timeout_s in {path} or make it return sooner"
    )
    with caplog.at_level(logging.WARNING, logger="engine.rollout.interactions"):
        for _ in range(2):  # each time on a new loop; the blocked ones are left behind
            nt, seconds = timed_generate(rollout, tiny[1], stall=True)
            assert seconds < STALL_S / 3
            # Every async call of that turn was pending on the blocked loop: sample 0's too.
            assert_timed_out(nt, 0, blocked)
            assert_timed_out(nt, 1, blocked)
            assert_answered(nt, 2)  # a plain method runs in its own thread, loop or not
    abandoned = [r for r in caplog.records if "blocked the interactions' event loop" in r.message]
    assert len(abandoned) == 1  # logged once
    nt, _ = timed_generate(rollout, tiny[1], stall=False)
    for i in range(3):
        assert_answered(nt, i)


def test_a_plain_function_past_the_default_timeout_is_a_recorded_error(tiny, tmp_path, release):
    model, tokenizer = tiny
    file = tmp_path / "stalling_interaction.py"
    file.write_text(
        f"from {HERE} import RELEASE, STALL_S\n\n\n"
        "def reply(messages, extra_info):\n"
        "    if extra_info['index'] == 1:\n"
        "        RELEASE.wait(STALL_S)\n"
        "    return {'role': 'user', 'content': 'fine'} if len(messages) < 3 else None\n"
    )
    config = RolloutConfig()
    config.multi_turn.enable = True
    config.multi_turn.interaction_path = str(file)
    config.multi_turn.interaction_name = "reply"
    rollout = MultiTurnRollout(HFRollout(model, tokenizer, None), tokenizer, config.multi_turn)
    assert rollout.interactions.timeouts == {"reply": DEFAULT_TIMEOUT_S}  # the tools' default
    rollout.interactions.timeouts["reply"] = 0.2  # the default, shortened for the test
    batch = prompts(tokenizer, ["1+1=", "2+2=", "3+3="], [None] * 3)
    started = time.monotonic()
    nt = generate(rollout, batch).non_tensor_batch
    assert time.monotonic() - started < STALL_S / 3
    error = (
        "interaction 'reply' timed out after 0.2 s; make it return sooner (a function from "
        "actor_rollout_ref.rollout.multi_turn.interaction_path has the default limit; an entry "
        "of actor_rollout_ref.rollout.multi_turn.interaction_config_path sets its own "
        "config.timeout_s)"
    )
    assert_timed_out(nt, 1, error)
    for i in (0, 2):  # "fine", then None ends the conversation
        assert nt["interaction_errors"][i] == []
        assert [m["role"] for m in nt["messages"][i]] == ["user", "assistant", "user", "assistant"]


def test_a_start_or_finalize_past_its_timeout_is_recorded(tmp_path, release):
    path = write_yaml(
        tmp_path,
        f"- {{name: life, class_name: {HERE}.StallingLifecycle, config: {{timeout_s: 0.2}}}}\n",
    )
    interactions = Interactions.from_yaml(path)
    sessions = [
        interactions.session({"interaction_kwargs": {"stall": stall}})
        for stall in ("start", "finalize", None)
    ]
    hint = f"raise its config.timeout_s in {path} or make it return sooner"
    started = time.monotonic()
    assert interactions.start(sessions) == [
        f"interaction 'life': start_interaction timed out after 0.2 s; {hint}",
        None,
        None,
    ]
    assert [s.started for s in sessions] == [False, True, True]  # no finalize for the first
    assert interactions.finish(sessions) == [
        None,
        f"interaction 'life': finalize_interaction timed out after 0.2 s; {hint}",
        None,
    ]
    assert time.monotonic() - started < STALL_S / 3


def test_the_plain_and_async_calls_of_a_turn_run_at_the_same_time():
    met = threading.Event()

    class Waiter:  # plain: waits for the async call, which must be running meanwhile
        def generate_response(self, instance_id, messages, **kwargs):
            return True, "met" if met.wait(STALL_S) else "alone", None, {}

    class Setter:
        async def generate_response(self, instance_id, messages, **kwargs):
            met.set()
            return True, "set", None, {}

    interactions = Interactions(
        {"waiter": Waiter(), "setter": Setter()}, timeouts={"waiter": 2.0, "setter": 2.0}
    )
    sessions = [
        interactions.session({"interaction_kwargs": {"name": n}}) for n in ("waiter", "setter")
    ]
    replies = interactions.respond(sessions, [[], []])
    assert [r.error for r in replies] == [None, None]
    assert [r.message["content"] for r in replies] == ["met", "set"]


# -- failures at startup: the key and the class named --------------------------------------------
@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            "- {class_name: no_such_module.Thing}\n",
            r"class_name='no_such_module.Thing' cannot be imported: ModuleNotFoundError.*next to the YAML",
        ),
        (
            "- {class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction}\n",
            r"Gsm8kInteraction' cannot be imported.*verl's own interactions are not installed",
        ),
        (f"- {{class_name: {HERE}.Missing}}\n", rf"module {HERE} has no class 'Missing'"),
        ("- {class_name: RetryInteraction}\n", "is not a dotted import path"),
        (f"- {{class_name: {HERE}.NoResponseMethod}}\n", "has no generate_response"),
        (
            f"- {{class_name: {HERE}.BrokenInit}}\n",
            r"could not be built with its config: KeyError: 'api_key'",
        ),
        (
            f"- {{name: a, class_name: {HERE}.EchoInteraction}}\n"
            f"- {{name: a, class_name: {HERE}.EchoInteraction}}\n",
            "two interactions are named 'a'",
        ),
        ("[]\n", "needs a non-empty list under 'interaction:'"),
        (
            f"- {{class_name: {HERE}.EchoInteraction, config: [1]}}\n",
            r"interaction\[0\]\.config must be a mapping",
        ),
        (
            f"- {{class_name: {HERE}.EchoInteraction}}\n"
            f"- {{name: slow, class_name: {HERE}.EchoInteraction, config: {{timeout_s: 0}}}}\n",
            r"interaction\[1\]\.config\.timeout_s=0: interaction 'slow' needs seconds > 0",
        ),
        (
            f"- {{class_name: {HERE}.EchoInteraction, config: {{timeout_s: soon}}}}\n",
            r"interaction\[0\]\.config\.timeout_s='soon': interaction 'echo' needs seconds > 0",
        ),
        (
            f"- {{class_name: {HERE}.EchoInteraction, config: {{timeout_s: true}}}}\n",
            r"config\.timeout_s=True: interaction 'echo' needs seconds > 0",
        ),
    ],
)
def test_interaction_yaml_problems_are_errors_at_startup_naming_the_key(tmp_path, entries, message):
    path = tmp_path / "interaction.yaml"
    path.write_text(("interaction: " if entries == "[]\n" else "interaction:\n") + entries)
    with pytest.raises((ImportError, ValueError), match=message) as info:
        load_interaction_config(path)
    assert str(info.value).startswith(f"{KEY}=")


def test_a_missing_yaml_and_a_second_interaction_key_are_refused(tmp_path, tiny):
    _, tokenizer = tiny
    with pytest.raises(FileNotFoundError, match=f"{KEY}=.* is not a file"):
        load_interaction_config(tmp_path / "missing.yaml")
    path = write_yaml(tmp_path, f"- {{class_name: {HERE}.EchoInteraction}}\n")
    config = rollout_config(path, interaction_path=str(tmp_path / "f.py"), interaction_name="f")
    with pytest.raises(ValueError, match="are both set; keep one"):
        MultiTurnRollout(None, tokenizer, config.multi_turn)


def test_a_class_in_a_module_next_to_the_yaml_is_found(tmp_path):
    (tmp_path / "posttrain_guess_next_to_yaml.py").write_text(
        "class GuessInteraction:\n"
        "    def __init__(self, config):\n"
        "        self.config = config\n"
        "    async def generate_response(self, instance_id, messages, **kwargs):\n"
        "        return True, 'ok', 1.0, {}\n"
    )
    path = write_yaml(tmp_path, "- {class_name: posttrain_guess_next_to_yaml.GuessInteraction}\n")
    built = load_interaction_config(path)
    assert list(built) == ["guess"]  # verl's default name: "GuessInteraction" -> "guess"
    assert built["guess"].config == {"name": "guess"}


def test_the_config_keys_are_checked_when_the_config_is(tmp_path):
    mt = "actor_rollout_ref.rollout.multi_turn"
    path = write_yaml(tmp_path, f"- {{class_name: {HERE}.EchoInteraction}}\n")
    ok = [f"{mt}.enable=true", f"{mt}.interaction_config_path={path}"]
    validate_config(load_config("grpo_tiny.yaml", ok), check_files=True)
    cases = [
        ([f"{mt}.interaction_config_path={tmp_path / 'missing.yaml'}"], "does not exist"),
        ([f"{mt}.interaction_path={tmp_path / 'f.py'}"], "both name an interaction"),
        ([f"{mt}.tokenization_sanity_check_mode=loose"], "tokenization_sanity_check_mode"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigValidationError, match=message):
            validate_config(load_config("grpo_tiny.yaml", [*ok, *overrides]), check_files=True)


def test_the_schema_marks_the_yaml_as_code_for_the_studio():
    from engine.config.keys import resolve_key

    field = resolve_key(KEY).field
    assert field.metadata["resource"] == "code"  # its class_names are imported
    assert field.metadata["effect"] == "honoured"


# -- through the trainer -------------------------------------------------------------------------
def test_a_grpo_step_with_a_yaml_interaction_rewards_its_turn_scores(tmp_path):
    from engine.trainer.run import run_training
    from tests.engine.trainer.test_trainer import ListRecorder

    reward = tmp_path / "turn_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return sum(extra_info['turn_scores'])\n"
    )
    path = write_yaml(
        tmp_path, f"- {{name: retry, class_name: {HERE}.RetryInteraction, config: {{rounds: 2}}}}\n"
    )
    mt = "actor_rollout_ref.rollout.multi_turn"
    config = load_config(
        "grpo_tiny.yaml",
        [
            *short_run(tmp_path, batch=2),
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.do_sample=false",  # greedy: every answer ends with EOS
            "data.max_response_length=32",
            f"custom_reward_function.path={reward}",
            f"{mt}.enable=true",
            f"{mt}.interaction_config_path={path}",
        ],
    )
    recorder = ListRecorder()
    assert run_training(config, recorder) == "succeeded"
    assert len(recorder.samples) == 4
    for sample in recorder.samples:
        assert sample.reward_error is None
        assert sample.reward == pytest.approx(1.25)  # 0.25 for "again", 1.0 for "done"
        assert [t["role"] for t in sample.turns] == ["assistant", "user", "assistant", "user"]
        assert sample.turns[-1]["ends"] is True
    ((_, metrics),) = recorder.steps
    assert metrics["critic/score/mean"] == pytest.approx(1.25)
    assert metrics["num_turns/mean"] == 2.0
