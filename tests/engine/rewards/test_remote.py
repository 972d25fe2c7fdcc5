"""The remote reward manager against a real HTTP service on loopback (``http.server`` in a
thread): verl's batch request and answer, each bad answer named with its service, timeouts and
retries, the bound on requests in flight, the per-run rate, the administrator's allowlist, and
one tiny GRPO training step scored by the service."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from engine.config import load_config, validate_config
from engine.config.fields import ConfigValidationError
from engine.config.reward_kwargs import reward_kwargs_problems
from engine.rewards.endpoints import ENDPOINTS_ENV, EndpointRefused, resolve_endpoint
from engine.rewards.remote import RemoteRewardManager
from engine.rewards.service import RateLimiter, ServiceError
from tests.engine.rewards.test_manager import RESPONSE_LEN, make_batch
from tests.engine.rewards.test_reward_managers import train_one_step
from tests.engine.tiny_run import short_run

ROWS = [
    {"data_source": "exact_match", "response": "12", "ground_truth": "12"},  # 3 tokens with EOS
    {"data_source": "judge", "response": "abcde", "ground_truth": "x", "extra_info": {"k": 1}},
    {"data_source": "exact_match", "response": "no", "ground_truth": "yes"},
]


class FakeService:
    """A reward service on 127.0.0.1: answers as ``mode`` says and records what it was sent."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict] = []
        self.failures_left = 0  # answers of 503 before the real one, in mode "flaky"
        self.delay = 0.0
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service.lock:
                    service.requests.append(body)
                    service.in_flight += 1
                    service.most_in_flight = max(service.most_in_flight, service.in_flight)
                try:
                    status, answer = service.answer(body)
                    time.sleep(service.delay)
                finally:
                    # Out of flight before the answer leaves: a client that has read it may
                    # send its next request before this thread runs again.
                    with service.lock:
                        service.in_flight -= 1
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if service.mode == "trickle":  # a byte every 0.1 s: never silent for long
                    for byte in answer:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.1)
                self.wfile.write(answer if service.mode != "trickle" else b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/score"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body: dict) -> tuple[int, bytes]:
        scores = [
            {"score": 1.0, "judge": "right"} if s == truth else 0.25
            for s, truth in zip(body["solution_strs"], body["ground_truths"], strict=True)
        ]
        if self.mode == "flaky":
            with self.lock:
                self.failures_left -= 1
                if self.failures_left >= 0:
                    return 503, b"busy"
        if self.mode == "slow":
            time.sleep(1.0)
        return {
            "not_json": (200, b"<html>502 Bad Gateway</html>"),
            "short": (200, json.dumps(scores[:-1]).encode()),
            "nan": (200, b"[NaN" + b", 0.5" * (len(scores) - 1) + b"]"),
            "infinite": (200, b"[1e999" + b", 0.5" * (len(scores) - 1) + b"]"),
            "object": (200, b'{"scores": []}'),
            "no_score": (200, json.dumps([{"reward": 1}] * len(scores)).encode()),
            "bad_request": (400, b"unknown field"),
            "redirect": (302, b""),
        }.get(self.mode, (200, json.dumps(scores).encode()))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service(monkeypatch):
    fake = FakeService()
    monkeypatch.setenv(ENDPOINTS_ENV, f"judge={fake.url}, other=https://judge.example/score")
    yield fake
    fake.close()


def manager(char_tokenizer, **kwargs) -> RemoteRewardManager:
    return RemoteRewardManager(
        char_tokenizer, **{"endpoint": "judge", "backoff_s": 0.01, "timeout": 5.0, **kwargs}
    )


# -- success ---------------------------------------------------------------------------------
def test_the_batch_is_posted_in_verls_shape_and_scores_land_on_each_last_token(
    char_tokenizer, service
):
    out = manager(char_tokenizer)(make_batch(char_tokenizer, ROWS), return_dict=True)
    assert service.requests == [
        {
            "data_sources": ["exact_match", "judge", "exact_match"],
            "solution_strs": ["12", "abcde", "no"],
            "ground_truths": ["12", "x", "yes"],
            "extra_infos": [None, {"k": 1}, None],
        }
    ]
    expected = torch.zeros(3, RESPONSE_LEN)
    expected[0, 2], expected[1, 5], expected[2, 2] = 1.0, 0.25, 0.25
    assert torch.equal(out["reward_tensor"], expected)
    info = out["reward_extra_info"]
    assert info["score"] == [1.0, 0.25, 0.25] and info["judge"] == ["right", None, None]
    assert info["reward_error"] == [None, None, None]
    assert out["meta_info"]["reward_failed"] == 0
    assert out["meta_info"]["reward_remote_requests"] == 1
    assert out["meta_info"]["reward_remote_retries"] == 0


def test_a_batch_goes_out_in_requests_of_batch_size_in_order(char_tokenizer, service):
    out = manager(char_tokenizer, batch_size=2)(make_batch(char_tokenizer, ROWS), return_dict=True)
    assert sorted(len(r["solution_strs"]) for r in service.requests) == [1, 2]
    assert out["reward_extra_info"]["score"] == [1.0, 0.25, 0.25]
    assert out["meta_info"]["reward_remote_requests"] == 2


def test_an_endpoint_is_named_by_its_listed_name_or_exact_url(char_tokenizer, service):
    by_url = manager(char_tokenizer, endpoint=service.url)
    assert by_url.client.endpoint == resolve_endpoint("judge")
    assert by_url(make_batch(char_tokenizer, ROWS[:1])).sum() == 1.0


# -- bad answers -----------------------------------------------------------------------------
BAD_ANSWERS = [
    ("not_json", "answered with a body that is not JSON"),
    ("short", "answered 2 scores for 3 responses"),
    ("nan", "answered with a body that is not JSON (NaN is not a number JSON allows)"),
    ("infinite", "answered inf for response 0, which is not a finite score"),
    ("object", "answered a JSON dict instead of a list"),
    ("no_score", "answered {'reward': 1} for response 0"),
    ("bad_request", "answered HTTP 400 Bad Request: 'unknown field'"),
    ("redirect", "answered HTTP 302"),  # an allowed service cannot send the run elsewhere
]


@pytest.mark.parametrize(("mode", "words"), BAD_ANSWERS)
def test_a_bad_answer_fails_its_responses_naming_the_service(char_tokenizer, service, mode, words):
    service.mode = mode
    out = manager(char_tokenizer)(make_batch(char_tokenizer, ROWS), return_dict=True)
    errors = out["reward_extra_info"]["reward_error"]
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith("ServiceError: reward service 'judge' ")
    assert words in errors[0]
    assert out["meta_info"]["reward_failed"] == 3 and out["reward_tensor"].abs().sum() == 0
    assert out["meta_info"]["reward_remote_retries"] == 0  # a wrong answer is not asked again


@pytest.mark.parametrize(("mode", "words"), BAD_ANSWERS[:3])
def test_with_on_error_fail_a_bad_answer_stops_the_run(char_tokenizer, service, mode, words):
    service.mode = mode
    with pytest.raises(ServiceError, match=r"^reward service 'judge' ") as exc:
        manager(char_tokenizer, on_error="fail")(make_batch(char_tokenizer, ROWS))
    assert words in str(exc.value)


def test_only_the_request_that_failed_fails_its_responses(char_tokenizer, service):
    service.mode = "bad_request"
    slow = manager(char_tokenizer, batch_size=2)
    original = service.answer
    service.answer = lambda body: (
        original(body) if len(body["solution_strs"]) == 1 else (200, b"[1, 0.5]")
    )
    out = slow(make_batch(char_tokenizer, ROWS), return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.0, 0.5, 0.0]
    assert [e is not None for e in out["reward_extra_info"]["reward_error"]] == [0, 0, 1]


# -- timeouts, retries, backpressure, rate -----------------------------------------------------
def test_a_slow_service_times_out_after_its_retries(char_tokenizer, service):
    service.mode = "slow"
    start = time.monotonic()
    out = manager(char_tokenizer, timeout=0.2, max_retries=1)(
        make_batch(char_tokenizer, ROWS), return_dict=True
    )
    assert time.monotonic() - start < 1.5  # two 0.2 s tries, not two 1 s answers
    assert out["reward_extra_info"]["reward_error"][0] == (
        "ServiceError: reward service 'judge' did not answer within the 0.2 s timeout "
        "(after 2 tries)"
    )
    assert len(service.requests) == 2 and out["meta_info"]["reward_remote_retries"] == 1


def test_an_answer_trickling_past_the_timeout_is_a_timeout(char_tokenizer, service):
    service.mode = "trickle"  # about 0.1 s per byte of a 30-byte answer
    start = time.monotonic()
    out = manager(char_tokenizer, timeout=0.5, max_retries=0)(
        make_batch(char_tokenizer, ROWS), return_dict=True
    )
    assert time.monotonic() - start < 2.0
    assert out["reward_extra_info"]["reward_error"][0] == (
        "ServiceError: reward service 'judge' did not answer within the 0.5 s timeout (after 1 try)"
    )


def test_an_answer_over_the_size_cap_is_a_bad_answer(char_tokenizer, service, monkeypatch):
    monkeypatch.setattr("engine.rewards.service.MAX_ANSWER_BYTES", 16)
    out = manager(char_tokenizer)(make_batch(char_tokenizer, ROWS), return_dict=True)
    error = out["reward_extra_info"]["reward_error"][0]
    assert error == "ServiceError: reward service 'judge' answered more than 16 bytes"
    assert out["meta_info"]["reward_remote_retries"] == 0


def test_a_busy_service_is_retried_with_backoff_until_it_answers(char_tokenizer, service):
    service.mode, service.failures_left = "flaky", 2
    start = time.monotonic()
    out = manager(char_tokenizer, max_retries=2, backoff_s=0.1)(
        make_batch(char_tokenizer, ROWS), return_dict=True
    )
    assert time.monotonic() - start >= 0.3  # waited 0.1 s, then 0.2 s
    assert out["reward_extra_info"]["score"] == [1.0, 0.25, 0.25]
    assert out["meta_info"]["reward_remote_requests"] == 3
    assert out["meta_info"]["reward_remote_retries"] == 2


def test_a_service_still_busy_after_the_retries_names_its_last_answer(char_tokenizer, service):
    service.mode, service.failures_left = "flaky", 5
    with pytest.raises(ServiceError) as exc:
        manager(char_tokenizer, max_retries=1, on_error="fail")(make_batch(char_tokenizer, ROWS))
    assert str(exc.value) == (
        "reward service 'judge' answered HTTP 503 Service Unavailable: 'busy' (after 2 tries)"
    )


def test_an_unreachable_service_is_named(char_tokenizer, service, monkeypatch):
    service.close()  # nothing listens on its port any more
    out = manager(char_tokenizer, max_retries=0)(make_batch(char_tokenizer, ROWS), return_dict=True)
    error = out["reward_extra_info"]["reward_error"][0]
    assert error.startswith("ServiceError: reward service 'judge' could not be reached: ")
    assert error.endswith("(after 1 try)")


def test_at_most_max_concurrent_requests_are_in_flight(char_tokenizer, service):
    service.delay = 0.1
    rows = ROWS * 2  # six requests of one response
    out = manager(char_tokenizer, batch_size=1, max_concurrent=2)(
        make_batch(char_tokenizer, rows), return_dict=True
    )
    assert len(service.requests) == 6 and service.most_in_flight == 2
    assert out["reward_extra_info"]["score"] == [1.0, 0.25, 0.25] * 2


def test_max_rpm_spaces_the_runs_requests():
    limiter = RateLimiter(240)  # 4 a second, a burst of 4
    start = time.monotonic()
    for _ in range(6):
        limiter.acquire()
    assert 0.45 <= time.monotonic() - start < 1.0  # the 5th and 6th waited 0.25 s each


def test_max_rpm_reaches_the_manager(char_tokenizer, service):
    scorer = manager(char_tokenizer, batch_size=1, max_rpm=240, max_concurrent=4)
    start = time.monotonic()
    scorer(make_batch(char_tokenizer, ROWS * 2))
    assert time.monotonic() - start >= 0.45 and len(service.requests) == 6


# -- the administrator's allowlist ---------------------------------------------------------------
def remote_errors(*overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as exc:
        validate_config(
            load_config("grpo_tiny", ["reward_model.reward_manager=remote", *overrides])
        )
    return {e.key: e.message for e in exc.value.errors}


def test_an_address_the_administrator_does_not_list_is_refused_at_validation(service):
    key = "reward_model.reward_kwargs.endpoint"
    for address in ("http://169.254.169.254/latest", "http://127.0.0.1:5432/", "judge2", 7):
        found = remote_errors(f"+{key}={address}")
        assert list(found) == [key], found
        assert "is not a reward service the administrator allows" in found[key]
        assert "name one of judge, other" in found[key]
        assert service.url not in found[key]  # the listed addresses are not shown
    found = remote_errors()
    assert "needs the reward service to post to" in found[key]
    validate_config(
        load_config("grpo_tiny", ["reward_model.reward_manager=remote", f"+{key}=judge"])
    )


def test_with_no_list_every_endpoint_is_refused_and_the_fix_is_named(monkeypatch, char_tokenizer):
    monkeypatch.delenv(ENDPOINTS_ENV, raising=False)
    ((key, message),) = reward_kwargs_problems("remote", {"endpoint": "http://127.0.0.1:1/"})
    assert key == "reward_model.reward_kwargs.endpoint"
    assert "none is listed yet: an administrator lists reward services in " in message
    with pytest.raises(ValueError, match="is not a reward service the administrator allows"):
        RemoteRewardManager(char_tokenizer, endpoint="http://127.0.0.1:1/")


def test_a_malformed_list_entry_is_an_error_naming_the_setting(monkeypatch):
    monkeypatch.setenv(ENDPOINTS_ENV, "judge=file:///etc/passwd")
    with pytest.raises(ValueError, match=f"{ENDPOINTS_ENV} entry 'judge=file:///etc/passwd'"):
        resolve_endpoint("judge")  # the administrator's error, where the run starts
    ((key, message),) = reward_kwargs_problems("remote", {"endpoint": "judge"})
    assert message == (  # the member's: the entry is not shown
        f"cannot be checked: the server's {ENDPOINTS_ENV} has a malformed entry; ask an "
        "administrator to fix it"
    )
    monkeypatch.setenv(ENDPOINTS_ENV, "http://10.0.0.5:8000/score?x=1")
    assert (
        resolve_endpoint("http://10.0.0.5:8000/score?x=1").name == "http://10.0.0.5:8000/score?x=1"
    )
    with pytest.raises(EndpointRefused):
        resolve_endpoint("http://10.0.0.5:8000/score")


@pytest.mark.parametrize(
    ("kwargs", "key", "words"),
    [
        ({"max_concurrent": 0}, "max_concurrent", "requests in flight, a whole number from 1"),
        ({"timeout": float("nan")}, "timeout", "finite number of seconds > 0"),
        ({"max_rpm": -1}, "max_rpm", "requests a minute, or null"),
        ({"on_error": "ignore"}, "on_error", "must be reward_error"),
        ({"batch_size": 1.5}, "batch_size", "responses per request"),
        ({"scale": 2}, "scale", "remote takes only endpoint, timeout"),
    ],
)
def test_bad_remote_settings_are_named_with_the_fix(service, kwargs, key, words):
    problems = dict(reward_kwargs_problems("remote", {"endpoint": "judge", **kwargs}))
    assert list(problems) == [f"reward_model.reward_kwargs.{key}"], problems
    assert words in problems[f"reward_model.reward_kwargs.{key}"]


def test_the_validator_refuses_what_remote_does_not_read(service, tmp_path):
    (tmp_path / "reward.py").write_text("def compute_score(*args):\n    return 1.0\n")
    found = remote_errors(
        "+reward_model.reward_kwargs.endpoint=judge",
        "reward.num_workers=2",
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
    )
    assert "has no effect with reward_model.reward_manager=remote" in found["reward.num_workers"]
    assert (
        "is not called by reward_model.reward_manager=remote"
        in found["custom_reward_function.path"]
    )


# -- a training step --------------------------------------------------------------------------
def test_reward_manager_remote_scores_a_training_step(tiny_assets, tmp_path, service):
    run, trainer = train_one_step(
        tmp_path,
        "reward_model.reward_manager=remote",
        "+reward_model.reward_kwargs.endpoint=judge",
        "+reward_model.reward_kwargs.batch_size=3",
    )
    assert isinstance(trainer.reward_fn, RemoteRewardManager)
    n = trainer.config.actor_rollout_ref.rollout.n
    assert len(run.samples) == 4 * n
    assert sum(len(r["solution_strs"]) for r in service.requests) == 4 * n
    assert max(len(r["solution_strs"]) for r in service.requests) == 3
    for sample in run.samples:
        right = sample.response_text == sample.ground_truth
        assert sample.reward == (1.0 if right else 0.25) and not sample.reward_error
    assert "reward/failed" not in run.metrics
    # The service's counts are the step's metrics, beside the other reward metrics.
    assert run.metrics["reward/remote_requests"] == len(service.requests) == -(-4 * n // 3)
    assert run.metrics["reward/remote_retries"] == 0
    assert run.metrics["timing_s/reward_remote_wait"] > 0


def test_with_on_error_fail_a_bad_answer_fails_the_training_run_naming_it(
    tiny_assets,
    tmp_path,
    service,
):
    from engine.trainer.ppo_trainer import PPOTrainer

    service.mode = "not_json"
    config = load_config(
        "grpo_tiny.yaml",
        overrides=[
            *short_run(tmp_path),
            "reward_model.reward_manager=remote",
            "+reward_model.reward_kwargs.endpoint=judge",
            "+reward_model.reward_kwargs.on_error=fail",
        ],
    )
    with pytest.raises(ServiceError, match="^reward service 'judge' answered with a body that"):
        PPOTrainer(config).fit()
