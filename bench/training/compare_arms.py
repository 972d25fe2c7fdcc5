"""The arms of ``compare_trl.py``: our engine, TRL's GRPOTrainer, and the raw parts of a step.

Each arm runs in its own process (``python -m bench.training.compare_trl <arm> ...``) and prints
one JSON line, so peak RSS is per arm. Both training arms get the same settings (see
``engine_overrides`` and ``trl_config``):

| setting | engine (verl keys) | TRL 1.16 |
| --- | --- | --- |
| 8 prompts x 4 samples | ``data.train_batch_size=8``, ``rollout.n=4`` | 32 completions per device batch, ``num_generations=4`` |
| one update per batch | ``ppo_mini_batch_size=8``, ``ppo_epochs=1`` | ``num_iterations=1``, ``steps_per_generation=1`` |
| KL to the reference | ``use_kl_loss``, ``kl_loss_coef=beta``, ``low_var_kl`` (k3 clamped at 10; ``--engine-kl k3_unclamped``: TRL's k3) | ``beta`` (k3), ``use_bias_correction_kl=False`` |
| loss | ``token-mean`` over the batch, clip 0.2 | ``loss_type="dapo"``, ``epsilon=0.2`` |
| advantages | ``grpo``, std-normalised per group | ``scale_rewards="group"`` |
| optimizer | AdamW, constant lr, weight decay 0, clip 1.0 | ``adamw_torch_fused``, constant lr, clip 1.0 |
| sampling | temperature 1, no top-k/top-p | temperature 1, ``top_k=0``, ``top_p=1`` |
| precision | fp32, no gradient checkpointing | ``bf16=False``, no gradient checkpointing |

Step time is the wall time between the ends of consecutive steps (everything the loop does:
sampling, rewards, reference pass, update, bookkeeping); the median skips the first three
steps. Greedy evaluations at ``--eval-steps`` are timed out of the step they follow.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.training.compare_tasks import (
    SCALES,
    CpuMeter,
    TaskData,
    chat_text,
    greedy_accuracy,
    machine_calib_s,
    peak_rss_mib,
    reward_for,
    rss_now_mib,
)
from bench.training.overrides import training_only

SKIP = 3  # warm-up steps left out of the medians


def run_footer(
    accuracy: dict[str, float], rss_after_imports: float, cpu: Any, calib: list[float]
) -> dict[str, Any]:
    """Return the figures every arm's result ends with: greedy accuracy by step, memory, the
    CPU use while training, the machine's calibration before and after, torch's threads."""
    import torch

    return {
        "accuracy_at_step": accuracy,
        "peak_rss_mib": peak_rss_mib(),
        "rss_after_imports_mib": rss_after_imports,
        "cpu_during_train": cpu,
        "machine_calib_s": calib,
        "threads": torch.get_num_threads(),
    }


PROMPTS_PER_STEP = 8
SAMPLES_PER_PROMPT = 4


def step_stats(wall: list[float], cpu: list[float], tokens: list[float]) -> dict[str, Any]:
    """Return the median/mean step time and rates over the steps after the warm-up.

    ``cpu`` is the process CPU time of each step: on a shared machine it moves much less than
    the wall time, since time spent waiting for a core is not counted.
    """
    steady = wall[SKIP:] or wall
    rates = [t / w for t, w in zip(tokens[SKIP:] or tokens, steady, strict=False)]
    median = statistics.median(steady)
    completions = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    return {
        "median_s_per_step": round(median, 4),
        "mean_s_per_step": round(statistics.mean(steady), 4),
        "completions_per_s": round(completions / median, 2),
        "generated_tokens_per_s": round(statistics.median(rates), 1),
        "mean_completion_len_tokens": round(statistics.mean(tokens) / completions, 3),
        "median_cpu_s_per_step": round(statistics.median(cpu[SKIP:] or cpu), 4),
        "step_wall_all_s": [round(w, 4) for w in wall],
        "step_cpu_all_s": [round(c, 4) for c in cpu],
    }


def median_of(rows: list[dict[str, float]], key: str) -> float | None:
    """Return the median of ``row[key]`` over the steps after the warm-up (None if absent)."""
    values = [row[key] for row in rows[SKIP:] or rows if key in row]
    return round(statistics.median(values), 4) if values else None


# -- engine --------------------------------------------------------------------------------------
def engine_overrides(
    args: Any, task: TaskData, out_dir: Path, controller: str, rollout: str = "hf"
) -> list[str]:
    """Return the verl overrides that give the engine the TRL arm's settings.

    ``rollout`` is the backend: ``hf`` (the engine's sampler) or ``vllm`` (vLLM's CPU build,
    fp32, as the ``hf`` rollout computes on a CPU).
    """
    scale = SCALES[args.scale]
    overrides = [
        f"data.train_files={task.train_parquet}",
        "data.val_files=null",
        "data.shuffle=False",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        "data.max_prompt_length=16",
        f"data.max_response_length={scale.max_new_tokens}",
        f"actor_rollout_ref.model.path={task.model_dir}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={args.beta}",
        f"actor_rollout_ref.actor.kl_loss_type={args.engine_kl}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.grad_clip=1.0",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        f"actor_rollout_ref.rollout.n={SAMPLES_PER_PROMPT}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=True",
        *training_only(args.steps, args.seed, out_dir),
    ]
    if args.scale == "medium":
        overrides += [
            f"custom_reward_function.path={Path(__file__).with_name('compare_tasks.py')}",
            "custom_reward_function.name=doubling_score",
        ]
    if rollout == "vllm":
        overrides += [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.dtype=float32",
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={256 * 1024**2}",
        ]
    if controller == "ray":
        overrides += [
            "trainer.controller=ray",
            "trainer.nnodes=1",
            "trainer.n_gpus_per_node=1",
            f"ray_init.num_cpus={max(1, args.threads)}",
        ]
    return overrides


def run_engine(
    args: Any, task: TaskData, controller: str = "local", rollout: str = "hf"
) -> dict[str, Any]:
    """Train with the engine's in-process (or Ray, one rank) controller and the ``rollout``
    backend; return its figures."""

    from bench.training.step_clock import StepClock
    from engine.config import load_config
    from engine.trainer.ppo_trainer import PPOTrainer

    rss_after_imports = rss_now_mib()
    eval_steps = set(args.eval_steps)

    class EvalClock(StepClock):
        """Time each step end to end and evaluate greedily at the chosen steps (untimed)."""

        def __init__(self) -> None:
            super().__init__()
            self.accuracy: dict[str, float] = {}
            self.trainer: Any = None

        def after_step(self, step: int) -> bool:
            if step not in eval_steps or controller != "local":
                return False
            model = self.trainer.arr.model
            self.accuracy[str(step)] = greedy_accuracy(
                model, self.trainer.tokenizer, task.test, args.scale
            )
            return True

    out_dir = Path(args.root) / args.scale / f"engine-{controller}-{rollout}"
    config = load_config(
        "grpo_tiny.yaml", overrides=engine_overrides(args, task, out_dir, controller, rollout)
    )
    clock = EvalClock()
    if controller == "ray":
        from engine.trainer.ray_trainer import RayPPOTrainer

        # The rank gets the in-process arm's threads (a CPU rank runs one per reserved CPU).
        trainer: Any = RayPPOTrainer(config, clock, cpus_per_rank=float(max(1, args.threads)))
    else:
        trainer = PPOTrainer(config, clock)
    clock.trainer = trainer
    calib_before = machine_calib_s()
    meter = CpuMeter()
    status = trainer.fit()
    cpu = meter.stop()
    calib_after = machine_calib_s()
    tokens = [
        m["response_length/mean"] * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT for m in clock.metrics
    ]
    rows = clock.metrics
    breakdown = {
        "generate_s": median_of(rows, "timing_s/gen"),
        "reward_s": median_of(rows, "timing_s/reward"),
        "old_log_prob_s": median_of(rows, "timing_s/old_log_prob"),
        "ref_log_prob_s": median_of(rows, "timing_s/ref"),
        "advantage_s": median_of(rows, "timing_s/adv"),
        "update_s": median_of(rows, "timing_s/update_actor"),
        "train_step_s": median_of(rows, "timing_s/step"),
    }
    return {
        "arm": {("local", "hf"): "engine", ("ray", "hf"): "engine_ray"}.get(
            (controller, rollout), f"engine_{rollout}"
        ),
        "status": status,
        **step_stats(clock.wall, clock.cpu, tokens),
        "step_breakdown_median_s": breakdown,
        "reward_all_steps": [round(m["critic/score/mean"], 4) for m in rows],
        "kl_loss_all_steps": [round(m.get("actor/kl_loss", float("nan")), 5) for m in rows],
        **run_footer(clock.accuracy, rss_after_imports, cpu, [calib_before, calib_after]),
    }


# -- TRL -----------------------------------------------------------------------------------------
def trl_config(args: Any, out_dir: Path) -> dict[str, Any]:
    """Return the GRPOConfig keywords of the TRL baseline, with the prompt order fixed."""
    scale = SCALES[args.scale]
    return {
        "output_dir": str(out_dir),
        "per_device_train_batch_size": PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,  # completions
        "num_generations": SAMPLES_PER_PROMPT,
        "gradient_accumulation_steps": 1,
        "max_completion_length": scale.max_new_tokens,
        "temperature": 1.0,
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "beta": args.beta,
        # verl's k3 loss: the gradient of the k3 estimate itself. TRL's default multiplies the
        # KL term by the (differentiable) importance ratio, which adds ``k3 * grad log p`` to the
        # gradient (DeepSeek-V3.2's unbiased form); ``bench.training.replay_trl`` measures it.
        "use_bias_correction_kl": False,
        "max_steps": args.steps,
        "logging_steps": 1,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "gradient_checkpointing": False,  # TRL's default is True
        "seed": args.seed,
        "data_seed": args.seed,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "log_completions": False,
        "shuffle_dataset": False,
    }


def trl_inputs(args: Any, task: TaskData) -> tuple[Any, Any, Any]:
    """Return TRL's tokenizer, its dataset of the run's prompts (in step order) and the reward."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    reward = reward_for(args.scale)
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    rows = task.train[: args.steps * PROMPTS_PER_STEP]
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": q}] for q, _ in rows],
            "answer": [a for _, a in rows],
        }
    )

    def reward_fn(completions: list, answer: list, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(t, a) for t, a in zip(texts, answer, strict=True)]

    return tokenizer, dataset, reward_fn


def check_trl_prompt_ids(trainer: Any, tokenizer: Any, task: TaskData) -> None:
    """Raise unless TRL renders the first prompt to the token ids the engine trains on."""
    question = task.train[0][0]
    prompt_ids = trainer._tokenize_prompts([[{"role": "user", "content": question}]])[0][0]
    engine_ids = tokenizer(chat_text(tokenizer, question), add_special_tokens=False)["input_ids"]
    if list(prompt_ids) != list(engine_ids):
        raise RuntimeError(f"TRL's prompt ids {prompt_ids} differ from the engine's {engine_ids}")


def run_trl(args: Any, task: TaskData) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer on the same model, prompts and settings; return its figures."""
    import torch
    import trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.training.trl_profile import capture_trl_profile

    torch.manual_seed(args.seed)
    rss_after_imports = rss_now_mib()
    eval_steps = set(args.eval_steps)
    tokenizer, dataset, reward_fn = trl_inputs(args, task)

    profile = capture_trl_profile()

    class TimedGRPOTrainer(GRPOTrainer):
        def _get_per_token_logps_and_entropies(self, model: Any, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            result = super()._get_per_token_logps_and_entropies(model, *a, **k)
            key = "ref_logps_fwd" if model is self.ref_model else "policy_logps_fwd"
            profile[key] = profile.get(key, 0.0) + time.perf_counter() - start
            return result

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self.profiles: list[dict[str, float]] = []
            self.accuracy: dict[str, float] = {}
            self.previous = (time.perf_counter(), time.process_time())

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.previous = (time.perf_counter(), time.process_time())

        def on_step_end(self, _args: Any, state: Any, *_: Any, **__: Any) -> None:
            now = (time.perf_counter(), time.process_time())
            self.wall.append(now[0] - self.previous[0])
            self.cpu.append(now[1] - self.previous[1])
            self.profiles.append(dict(profile))
            profile.clear()
            if state.global_step in eval_steps:
                self.accuracy[str(state.global_step)] = greedy_accuracy(
                    trainer.model, tokenizer, task.test, args.scale
                )
                now = (time.perf_counter(), time.process_time())
            self.previous = now

    clock = StepClock()
    out_dir = Path(args.root) / args.scale / "trl-out"
    trainer = TimedGRPOTrainer(
        model=task.model_dir,
        reward_funcs=reward_fn,
        args=GRPOConfig(**trl_config(args, out_dir)),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    check_trl_prompt_ids(trainer, tokenizer, task)
    calib_before = machine_calib_s()
    meter = CpuMeter()
    trainer.train()
    cpu = meter.stop()
    calib_after = machine_calib_s()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    tokens = [h["completions/mean_length"] * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT for h in logs]

    def prof(suffix: str) -> float | None:
        values = [sum(v for k, v in p.items() if k.endswith(suffix)) for p in clock.profiles]
        return round(statistics.median(values[SKIP:] or values), 4) if values else None

    step_time = [h["step_time"] for h in logs if "step_time" in h]
    train_step = round(statistics.median(step_time[SKIP:] or step_time), 4) if step_time else None
    breakdown = {
        "generate_s": prof("transformers.generate"),
        "ref_log_prob_s": prof("ref_logps_fwd"),
        "policy_fwd_loss_s": prof("compute_loss"),
        "prepare_inputs_s": prof("_prepare_inputs"),
        "train_step_s": train_step,
    }
    if train_step is not None and breakdown["prepare_inputs_s"] is not None:
        breakdown["update_s"] = round(train_step - breakdown["prepare_inputs_s"], 4)
    return {
        "arm": "trl",
        "versions": {"trl": trl.__version__},
        **step_stats(clock.wall, clock.cpu, tokens),
        "step_breakdown_median_s": breakdown,
        "reward_all_steps": [round(h["reward"], 4) for h in logs],
        "kl_all_steps": [round(h.get("kl", float("nan")), 5) for h in logs],
        **run_footer(clock.accuracy, rss_after_imports, cpu, [calib_before, calib_after]),
    }


# -- raw parts -----------------------------------------------------------------------------------
def run_raw(args: Any, task: TaskData, reps: int = 5) -> dict[str, Any]:
    """Time the parts of a step directly on the model: the limit a framework can approach.

    ``generate`` samples 32 completions (8 prompts x 4) with ``model.generate`` and stops at EOS;
    the forward (no grad), forward+backward and fused AdamW step (with norm clipping) run on 32
    sequences of the prompt plus the longest completion of a typical sampled batch, the length
    both frameworks pad a step's batch to.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    model = AutoModelForCausalLM.from_pretrained(task.model_dir, dtype=torch.float32)
    max_new = SCALES[args.scale].max_new_tokens
    questions = [q for q, _ in task.train[:PROMPTS_PER_STEP] for _ in range(SAMPLES_PER_PROMPT)]
    enc = tokenizer(
        [chat_text(tokenizer, q) for q in questions],
        add_special_tokens=False,
        padding=True,
        padding_side="left",
        return_tensors="pt",
    )
    prompt_len = int(enc["input_ids"].shape[1])
    eos = tokenizer.eos_token_id
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)

    cpu_medians: dict[str, float] = {}

    def timeit(fn: Any, warm: int = 2) -> tuple[float, list[float]]:
        for _ in range(warm):
            fn()
        times, cpu = [], []
        for _ in range(reps):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        cpu_medians[fn.__name__] = statistics.median(cpu)
        return statistics.median(times), times

    meter = CpuMeter()
    model.eval()
    longest: list[int] = []
    mean_len: list[float] = []

    def generate() -> None:
        with torch.inference_mode():
            out = model.generate(
                **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=max_new, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
            )  # fmt: skip
        completion = out[:, prompt_len:]
        is_eos = completion == eos
        lengths = torch.where(
            is_eos.any(1),
            is_eos.int().argmax(1) + 1,
            torch.full_like(is_eos[:, 0], is_eos.shape[1], dtype=torch.long),
        )
        longest.append(int(lengths.max()))
        mean_len.append(float(lengths.float().mean()))

    gen_s, gen_runs = timeit(generate)
    seq_len = prompt_len + int(statistics.median(longest))
    ids = torch.randint(10, len(tokenizer), (len(questions), seq_len), generator=generator)
    mask = torch.ones_like(ids)

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)

    fwd_s, fwd_runs = timeit(forward)
    model.train()

    def forward_backward() -> None:
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    fwd_bwd_s, fwd_bwd_runs = timeit(forward_backward)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, fused=True)
    opt_times: list[float] = []

    def optimizer_step() -> None:
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        start = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        opt_times.append(time.perf_counter() - start)

    timeit(optimizer_step, warm=1)
    opt_s = statistics.median(opt_times[-reps:])
    cpu = meter.stop()
    return {
        "arm": "raw",
        "n_sequences": len(questions),
        "prompt_len": prompt_len,
        "seq_len": seq_len,
        "generate_stop_at_eos_s": round(gen_s, 4),
        "generate_runs_s": [round(t, 4) for t in gen_runs],
        "generate_mean_len": round(statistics.mean(mean_len), 2),
        "generate_longest_len_median": statistics.median(longest),
        "fwd_no_grad_s": round(fwd_s, 4),
        "fwd_bwd_s": round(fwd_bwd_s, 4),
        "fwd_bwd_runs_s": [round(t, 4) for t in fwd_bwd_runs],
        "adamw_fused_step_s": round(opt_s, 4),
        "raw_sum_s": round(gen_s + fwd_s + fwd_bwd_s + opt_s, 4),
        "raw_sum_cpu_s": round(
            sum(cpu_medians[k] for k in ("generate", "forward", "forward_backward")) + opt_s, 4
        ),
        "cpu_medians_s": {k: round(v, 4) for k, v in cpu_medians.items()},
        "fwd_runs_s": [round(t, 4) for t in fwd_runs],
        "peak_rss_mib": peak_rss_mib(),
        "cpu_during_bench": cpu,
        "machine_calib_s": [machine_calib_s()],
        "threads": torch.get_num_threads(),
    }


def print_result(result: dict[str, Any]) -> None:
    """Print the arm's result as the one JSON line the driver reads."""
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
