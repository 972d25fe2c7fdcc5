#!/usr/bin/env bash
# The device check: the paths only a GPU exercises, and the engine against TRL on a real-size model.
#
#   scripts/gpu_check.sh --prepare   here: download the wheels the GPU image lacks into .whl/
#   scripts/gpu_check.sh             on the GPU machine: install .whl/, run the stages (< 8 min)
#   scripts/gpu_check.sh --cpu       here: the same stages on this CPU with a tiny model (CI smoke)
#
# Stages, each under its own time limit (and all under one deadline) so a hang costs one stage:
# versions, engine.device_info, pytest -m gpu, the vLLM tests on CUDA vLLM (where it imports),
# the model (random Qwen2, 0.5B shape, bf16), the engine's GRPO (FSDP2 on a one-rank NCCL group,
# HF rollout), TRL's GRPOTrainer at the same settings, and the summary: $OUT/gpu_check.json (or
# gpu-check-out/ here) and a table.
# A failed stage is reported and the next one runs; the exit status is non-zero if any failed.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

# What the GPU image (Python 3.12, torch 2.11, transformers 5.17) lacks; pure Python, ~2.2 MB.
WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
  sqlparse==0.6.1 psutil==7.2.2)
WHEEL_DIR="${GPU_CHECK_WHEEL_DIR:-$ROOT/.whl}"

prepare_wheels() {
  mkdir -p "$WHEEL_DIR"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEEL_DIR" "${WHEELS[@]}" 2>&1 |
    grep -v '^WARNING: Location' || true
  local count size
  count=$(find "$WHEEL_DIR" -type f -name '*.whl' | wc -l)
  size=$(du -sm "$WHEEL_DIR" | cut -f1)
  [ "$count" -ge "${#WHEELS[@]}" ] || die "only $count of ${#WHEELS[@]} wheels downloaded into $WHEEL_DIR; run the pip download above by hand to see why."
  [ "$size" -lt 60 ] || die "$WHEEL_DIR holds $size MiB; the device call carries at most 64 MiB with the tree. Remove stale wheels."
  say "$count wheels, $size MiB, in $WHEEL_DIR (name .whl in the device call's carry)"
}

mode=gpu
case "${1:-}" in
  --prepare) prepare_wheels; exit 0 ;;
  --cpu) mode=cpu ;;
  "") ;;
  *) die "unknown option '$1'; use --prepare, --cpu, or nothing (on the GPU machine)." ;;
esac

OUT_DIR="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT_DIR"
WORK="$(mktemp -d /tmp/gpu-check.XXXXXX)"
# The carried wheels go into a folder of their own, first on the path (the device image's own
# packages stay as they are). With --cpu, GPU_CHECK_PYTHON picks the Python to run (default: the
# project's venv) and GPU_CHECK_WHEEL_DIR, if set too, installs wheels for it as on the device:
# a rehearsal here with a Python laid out like the GPU image's.
install_wheels() {
  if ! compgen -G "$WHEEL_DIR/*.whl" >/dev/null; then
    say "no wheels in $WHEEL_DIR: using the installed packages (trl and datasets for the TRL arm)"
    return 0
  fi
  say "installing the carried wheels into $WORK/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WORK/site" "$WHEEL_DIR"/*.whl || die "the carried wheels did not install (see above)."
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
}

if [ "$mode" = gpu ]; then
  PY="${GPU_CHECK_PYTHON:-python3}"
  SIZE="${GPU_CHECK_SIZE:-0.5b}" STEPS=6 ENGINE_BUDGET=120 TRL_BUDGET=150 DEADLINE=470
  install_wheels
else
  SIZE=tiny STEPS=3 ENGINE_BUDGET=60 TRL_BUDGET=60 DEADLINE=400
  if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    PY="$GPU_CHECK_PYTHON"
    if [ -n "${GPU_CHECK_WHEEL_DIR:-}" ]; then install_wheels; fi
  else
    ensure_venv test,bench
    PY="$VENV/bin/python"
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export POSTTRAIN_DATA_DIR="$WORK/data"

START=$(date +%s)
FAILED=()
: >"$OUT_DIR/stages.txt"
: >"$OUT_DIR/gpu_check.log"

# stage NAME LIMIT_S COMMAND...: run under min(LIMIT_S, what is left of the deadline), log to
# $OUT_DIR/gpu_check.log and the console, and record the outcome; never stops the script. (The
# device call brings back at most 8 files: one log, the stage list and two JSON files.)
stage() {
  local name="$1" limit="$2" left rc t0
  shift 2
  left=$((DEADLINE - ($(date +%s) - START)))
  [ "$left" -lt "$limit" ] && limit="$left"
  if [ "$limit" -le 5 ]; then
    echo "$name skipped: the ${DEADLINE} s deadline is spent" | tee -a "$OUT_DIR/stages.txt"
    FAILED+=("$name")
    return 0
  fi
  say "stage $name (limit ${limit} s)"
  t0=$(date +%s)
  set +e
  echo "==> stage $name" >>"$OUT_DIR/gpu_check.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT_DIR/gpu_check.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "$name rc=$rc $(($(date +%s) - t0)) s" | tee -a "$OUT_DIR/stages.txt"
  [ "$rc" -eq 0 ] || FAILED+=("$name")
}

VERSIONS='
import importlib.metadata as m, platform, sys
print("python", sys.version.split()[0], platform.machine())
for p in ["torch", "transformers", "tokenizers", "accelerate", "peft", "trl", "datasets",
          "pyarrow", "pandas", "numpy", "fsspec", "huggingface_hub", "safetensors", "sqlparse",
          "ray", "django", "celery", "vllm", "flash_attn", "flash-attn"]:
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, "absent")
'
stage versions 60 "$PY" -c "$VERSIONS"
if command -v nvidia-smi >/dev/null; then stage nvidia_smi 30 nvidia-smi; fi
stage device_info 60 "$PY" -m engine.device_info
"$PY" -m engine.device_info --json >"$OUT_DIR/device_info.json" 2>/dev/null || true
mapfile -t GPU_TESTS < <(grep -rl --include='*.py' 'pytest.mark.gpu' tests | sort)
stage pytest_gpu 180 "$PY" -m pytest -p no:cacheprovider -m gpu -v -rs "${GPU_TESTS[@]}"
# CUDA vLLM: the vLLM rollout's CPU tests (the real engine: log-probs, weight sync, sampling keys,
# tool calls, the server) on the GPU's vLLM build. CI runs them on vLLM's CPU build, so --cpu and
# a machine without vLLM skip the stage (the gpu tests above hold bf16 and sleep mode).
VLLM_TESTS=(tests/engine/rollout/test_vllm_engine.py tests/engine/rollout/test_vllm_server.py
  tests/engine/rollout/test_multi_turn_engines.py)
if [ "$mode" = gpu ] && "$PY" -c 'import vllm' >/dev/null 2>&1; then
  stage vllm 240 "$PY" -m pytest -p no:cacheprovider -v -rs "${VLLM_TESTS[@]}"
else
  echo "vllm skipped: $([ "$mode" = gpu ] && echo 'vLLM does not import here' || echo 'CI runs these on the CPU build')" |
    tee -a "$OUT_DIR/stages.txt"
fi
# bench.training.gpu_grpo runs as a module: the script is at the repository root, on PYTHONPATH.
stage prepare 120 "$PY" -m bench.training.gpu_grpo prepare --work "$WORK" --size "$SIZE" \
  --steps "$STEPS"
stage engine $((ENGINE_BUDGET + 60)) "$PY" -m bench.training.gpu_grpo engine --work "$WORK" \
  --steps "$STEPS" --budget-s "$ENGINE_BUDGET"
stage trl $((TRL_BUDGET + 60)) "$PY" -m bench.training.gpu_grpo trl --work "$WORK" \
  --steps "$STEPS" --budget-s "$TRL_BUDGET"
DEADLINE=$((DEADLINE + 30))  # the summary runs whatever the stages left
stage summary 30 "$PY" -m bench.training.gpu_grpo summary --work "$WORK" \
  --out "$OUT_DIR/gpu_check.json"

say "done in $(($(date +%s) - START)) s; results in $OUT_DIR"
rm -rf "$WORK"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "failed stages: ${FAILED[*]}" | tee -a "$OUT_DIR/stages.txt"
  exit 1
fi
