"""Run a candidate's stdio tests on SandboxFusion (``reward_model.sandbox_fusion.url``), verl's
code-execution service, instead of the local bubblewrap sandbox.

SandboxFusion (github.com/bytedance/SandboxFusion) runs a program it is posted at its
``/run_code`` API and answers with its output; verl's ``sandbox_fusion`` reward posts one
request per test case as here::

    {"code": ..., "stdin": ..., "language": "python", "compile_timeout": ..., "run_timeout": ...,
     "memory_limit_MB": ..., "files": {}, "fetch_files": []}
    -> {"status": "Success" | "Failed" | "SandboxError",
        "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error", "stdout": ...,
                       "stderr": ..., "return_code": ...}}

The url names an entry of the administrator's ``POSTTRAIN_REWARD_ENDPOINTS``
(``engine.rewards.endpoints``), checked when the config is and again here; requests go through
``engine.rewards.service`` (timeouts, retries with back-off, no redirects). A response's tests are
posted at most ``max_concurrent`` at a time, in each scoring process. The limits are the local
sandbox's (``POSTTRAIN_SANDBOX_*``, lowered by the row or the reward's keyword arguments):
``run_timeout`` is the candidate's ``timeout_s``, and ``memory_limit_MB`` the lower of
``memory_limit_mb`` and ``memory_mb``.

Only stdio tests are judged this way: their verdict is made here, comparing the program's stdout
with the expected output, which never leaves this process. An assertion test's verdict would be
the exit status of one program holding both the candidate and the asserts, which the candidate
can forge (``os._exit(0)``); the local sandbox judges those with the two-sandbox protocol
(``engine.rewards.code_exec``), so an assertion suite here is that response's error. A service
that cannot be reached, answers ``SandboxError`` or something that is not SandboxFusion's answer
is an error naming the service, recorded as the response's ``reward_error``.
"""

from __future__ import annotations

import math
from typing import Any

from engine.rewards import sandbox
from engine.rewards.code_tests import MAX_ERROR_CHARS, Reports, TestSuite, score
from engine.rewards.endpoints import resolve_endpoint
from engine.rewards.service import ServiceClient

# Seconds a request may take beyond the program's own run time (verl's API_TIMEOUT).
API_TIMEOUT_S = 10.0
# verl's defaults for reward_model.sandbox_fusion.
DEFAULT_MAX_CONCURRENT = 64
DEFAULT_MEMORY_LIMIT_MB = 1024


def run_tests_fusion(
    code: str, suite: TestSuite, limits: sandbox.Limits, settings: dict[str, Any]
) -> dict[str, Any]:
    """Run ``code`` against stdio ``suite`` on the SandboxFusion service ``settings["url"]``
    names; return the result parts as the local sandbox does."""
    if suite.mode != "stdio":
        raise ValueError(
            "assertion tests are not judged on SandboxFusion (the candidate's own process would "
            "report its verdict); give stdin/stdout tests, or unset "
            "reward_model.sandbox_fusion.url to judge them in the local sandbox"
        )
    memory = min(
        float(settings.get("memory_limit_mb") or DEFAULT_MEMORY_LIMIT_MB), limits.memory_mb
    )
    client = ServiceClient(
        resolve_endpoint(settings.get("url")),
        timeout=limits.timeout_s + API_TIMEOUT_S,
        max_concurrent=int(settings.get("max_concurrent") or DEFAULT_MAX_CONCURRENT),
    )
    run_timeout = max(1, math.ceil(limits.timeout_s))

    def run(index: int) -> tuple[int, Any, str | None, bool]:
        answer = client.post(
            {
                "code": code,
                "stdin": suite.inputs[index],
                "language": "python",
                "compile_timeout": run_timeout,
                "run_timeout": run_timeout,
                "memory_limit_MB": int(memory),
                "files": {},
                "fetch_files": [],
            }
        )
        return (index, *_verdict(client, answer))

    reports: Reports = {}
    timed_out = False
    for index, stdout, error, late in client.map(run, list(range(suite.total))):
        timed_out = timed_out or late
        if not late:
            reports[index] = (stdout, error)
    return score(suite, reports, timed_out, "")


def _verdict(client: ServiceClient, answer: Any) -> tuple[Any, str | None, bool]:
    """Return (stdout, error or None, timed out) from a SandboxFusion answer."""
    status = answer.get("status") if isinstance(answer, dict) else None
    run = answer.get("run_result") if isinstance(answer, dict) else None
    if status == "SandboxError":
        message = str(answer.get("message") or "")[:MAX_ERROR_CHARS]
        raise client.error(f"answered SandboxError: {message!r}")
    if status not in ("Success", "Failed") or not isinstance(run, dict):
        shown = repr(answer)[:MAX_ERROR_CHARS]
        raise client.error(
            f"answered {shown}, which is not SandboxFusion's run_code answer (a status and a "
            "run_result)"
        )
    if run.get("status") == "TimeLimitExceeded":
        return None, "timed out", True
    stdout = run.get("stdout")
    if run.get("status") == "Finished" and run.get("return_code") == 0:
        return stdout if isinstance(stdout, str) else "", None, False
    stderr = str(run.get("stderr") or "").strip().splitlines()
    last = stderr[-1] if stderr else ""
    return stdout, f"exit {run.get('return_code')}: {last}"[:MAX_ERROR_CHARS], False
