"""``reward_model.sandbox_fusion.url``: the code reward's stdio tests run on a SandboxFusion
service (a fake one on loopback that runs the test's own programs with ``python -I``), only an
allowed one, and its failures are errors that name it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.config import load_config, resolve_config, validate_config
from engine.config.fields import ConfigValidationError
from engine.rewards import code_exec
from engine.rewards.endpoints import ENDPOINTS_ENV
from engine.rewards.service import ServiceError
from engine.trainer.build import build_reward_manager
from tests.engine.rewards.test_manager import make_batch

DOUBLE = "```python\nprint(int(input()) * 2)\n```"
TESTS = {"inputs": ["1", "2", "3"], "outputs": ["2", "4", "7"]}  # the third expects a wrong 7


class FakeSandboxFusion:
    """SandboxFusion's ``/run_code`` on 127.0.0.1; ``mode`` ``sandbox_error`` or ``garbage``
    answers wrongly."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body)
                answer = json.dumps(service.run(body)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/run_code"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def run(self, body: dict) -> object:
        if self.mode == "sandbox_error":
            return {"status": "SandboxError", "message": "no runner left"}
        if self.mode == "garbage":
            return ["not", "an", "answer"]
        try:
            done = subprocess.run(  # the test's own programs, not a model's
                [sys.executable, "-I", "-c", body["code"]],
                input=body["stdin"],
                capture_output=True,
                text=True,
                timeout=body["run_timeout"],
            )
        except subprocess.TimeoutExpired:
            return {"status": "Failed", "run_result": {"status": "TimeLimitExceeded"}}
        finished = {
            "status": "Finished",
            "stdout": done.stdout,
            "stderr": done.stderr,
            "return_code": done.returncode,
        }
        return {"status": "Success" if done.returncode == 0 else "Failed", "run_result": finished}


@pytest.fixture
def fusion(monkeypatch):
    fake = FakeSandboxFusion()
    monkeypatch.setenv(ENDPOINTS_ENV, f"sandbox={fake.url}")
    monkeypatch.setenv("POSTTRAIN_SANDBOX_MEMORY_MB", "512")
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


SETTINGS = {"url": "sandbox", "max_concurrent": 2, "memory_limit_mb": 1024}


def test_stdio_tests_run_on_the_service_and_are_judged_here(fusion):
    parts = code_exec.compute_score(DOUBLE, TESTS, timeout_s=3, sandbox_fusion=SETTINGS)
    assert parts["passed"] == 2 and parts["total"] == 3 and parts["score"] == pytest.approx(2 / 3)
    assert parts["error"] == "test 2: wrong output" and parts["timed_out"] == 0
    assert sorted(r["stdin"] for r in fusion.requests) == ["1", "2", "3"]
    request = fusion.requests[0]
    assert request["code"] == "print(int(input()) * 2)\n" and request["language"] == "python"
    assert request["run_timeout"] == 3
    assert request["memory_limit_MB"] == 512  # the local ceiling is lower than the 1024 asked


def test_a_failing_or_slow_program_fails_its_tests(fusion):
    crash = code_exec.compute_score(
        "```python\nraise ValueError('no')\n```", TESTS, sandbox_fusion=SETTINGS
    )
    assert crash["passed"] == 0 and crash["error"] == "exit 1: ValueError: no"
    slow = code_exec.compute_score(
        "```python\nwhile True: pass\n```", {"inputs": ["1"], "outputs": ["1"]},
        timeout_s=1, sandbox_fusion=SETTINGS,
    )  # fmt: skip
    assert slow["timed_out"] == 1 and slow["error"] == "timed out"


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("sandbox_error", "answered SandboxError: 'no runner left'"),
        ("garbage", "which is not SandboxFusion's run_code answer"),
    ],
)
def test_a_bad_answer_is_an_error_naming_the_service(fusion, mode, words):
    fusion.mode = mode
    with pytest.raises(ServiceError, match="^reward service 'sandbox' ") as exc:
        code_exec.compute_score(DOUBLE, TESTS, sandbox_fusion=SETTINGS)
    assert words in str(exc.value)


def test_assertion_tests_are_never_judged_by_the_candidates_own_process(fusion):
    with pytest.raises(ValueError, match="assertion tests are not judged on SandboxFusion"):
        code_exec.compute_score(
            "def f(): return 1", {"assert": "assert f() == 1"}, sandbox_fusion=SETTINGS
        )
    assert fusion.requests == []


def test_an_address_not_listed_is_refused_at_validation_and_at_the_call(fusion):
    key = "reward_model.sandbox_fusion.url"
    with pytest.raises(ConfigValidationError) as exc:
        validate_config(load_config("grpo_tiny", [f"{key}=http://10.1.1.1/run_code"]))
    ((error),) = exc.value.errors
    assert error.key == key and "is not a reward service the administrator allows" in error.message
    with pytest.raises(ValueError, match="is not a reward service the administrator allows"):
        code_exec.compute_score(DOUBLE, TESTS, sandbox_fusion={"url": "http://10.1.1.1/"})
    assert fusion.requests == []
    with pytest.raises(ConfigValidationError, match="which reward_model.reward_manager=batch"):
        validate_config(
            load_config("grpo_tiny", [f"{key}=sandbox", "reward_model.reward_manager=batch"])
        )


def test_the_trainers_reward_manager_sends_code_rows_to_the_service(fusion, char_tokenizer):
    config = load_config(
        "grpo_tiny",
        ["reward_model.sandbox_fusion.url=sandbox", "reward_model.sandbox_fusion.max_concurrent=1"],
    )
    validate_config(config)
    manager = build_reward_manager(resolve_config(config), char_tokenizer)
    rows = [
        {
            "data_source": "code",
            "response": "print(int(input())*2)",
            "ground_truth": json.dumps(TESTS),
        },
        {"data_source": "exact_match", "response": "12", "ground_truth": "12"},
    ]
    out = manager(make_batch(char_tokenizer, rows), return_dict=True)
    assert out["reward_extra_info"]["score"] == [pytest.approx(2 / 3), 1.0]
    assert len(fusion.requests) == 3  # the code row's three tests; exact_match stays local
