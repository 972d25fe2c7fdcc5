#!/usr/bin/env python3
"""Is the engine's GRPO update TRL's? TRL replays the engine's rollouts and the weights are compared.

``compare_trl.py`` compares the two frameworks end to end, each sampling its own completions, so
its held-out accuracies differ by the luck of the draw as well as by anything the frameworks do
differently (over 20 seeds the seed-to-seed spread is several points). This script takes the
sampling out: the engine trains ``--steps`` steps and keeps, for each step, the completions it
sampled and its weights after the update; then TRL's ``GRPOTrainer`` trains from the same
initial model on the same prompts with the settings of ``compare_arms.trl_config``, its
generation replaced by the engine's completions of that step (the prompt ids TRL asks to
complete are checked against the engine's). Everything else is TRL's own: the reward call,
the group advantages, the reference pass, the k3 KL, the DAPO token-mean loss, the clipping and
AdamW. Where the two update rules agree, the weights agree after every step to float rounding.

Per step it prints the cosine between the two runs' updates and the ratio of their norms, the
distance between their weights over the distance travelled from the start (all parameters as
one vector), the largest single weight difference, and the metrics both log: mean reward, KL,
gradient norm (before clipping). Three comparisons, each against the plain TRL replay:

* the engine;
* a control: TRL started one unit in the last place away from the same weights, which shows
  how far rounding alone carries two runs of the same update rule apart;
* TRL with its own default KL gradient (``use_bias_correction_kl=True``, DeepSeek-V3.2's
  importance-weighted k3), which verl's k3 loss does not have and the benchmark turns off: a
  real difference a few percent of the KL term in size, to show what one looks like here.

Usage (from the repository root)::

    .venv/bin/python -m bench.training.replay_trl --steps 20

The results JSON goes to ``--results-dir`` (``bench/results``), the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.training.compare_trl import OFFLINE_ENV, RESULTS, add_engine_kl_argument

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

Weights = dict[str, Any]  # parameter name -> tensor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the settings: those of ``compare_trl.py --scale tiny`` unless given."""
    from bench.training.compare_tasks import SCALES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=SCALES["tiny"].lr)
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (k3)")
    add_engine_kl_argument(parser)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)))
    parser.add_argument("--root", default=None, help="default <POSTTRAIN_DATA_DIR>/compare_trl")
    parser.add_argument("--results-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    args.scale = "tiny"
    args.eval_steps = []
    if args.root is None:
        from engine.env import data_dir

        args.root = str(data_dir() / "compare_trl")
    return args


def snapshot(model: Any) -> Weights:
    """Return a detached copy of the model's parameters."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def difference(a: Weights, b: Weights) -> Any:
    """Return ``a - b`` as one flat vector over every parameter."""
    import torch

    if a.keys() != b.keys():
        raise ValueError(f"different parameters: {sorted(a.keys() ^ b.keys())[:5]}")
    return torch.cat([(a[k] - b[k]).flatten().double() for k in sorted(a)])


def run_engine(args: argparse.Namespace, task: Any) -> dict[str, Any]:
    """Train with the engine; return its initial weights, and per step its completions and weights.

    The completions of a row are its prompt's ids without padding and its response up to and
    including the first EOS (the tokens the loss sees), in the order the rollout returns them
    (each prompt's samples next to each other, as TRL orders them).
    """
    from bench.training.compare_arms import engine_overrides
    from engine.config import load_config
    from engine.trainer.ppo_trainer import PPOTrainer
    from engine.trainer.reporting import Recorder

    rollouts: list[dict[str, Any]] = []
    weights: list[Weights] = []
    logged: list[dict[str, Any]] = []

    class Keep(Recorder):
        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            weights.append(snapshot(trainer.arr.model))
            logged.append(
                run_metrics(
                    metrics["critic/score/mean"],
                    metrics.get("actor/kl_loss"),
                    metrics.get("actor/grad_norm"),
                )
            )

    out_dir = Path(args.root) / "replay" / "engine"
    config = load_config("grpo_tiny.yaml", overrides=engine_overrides(args, task, out_dir, "local"))
    trainer = PPOTrainer(config, Keep())
    initial = snapshot(trainer.arr.model)
    generate = trainer.arr.generate_sequences

    def keep_rollout(batch: Any, **kwargs: Any) -> Any:
        gen = generate(batch, **kwargs)
        prompts, mask = gen.batch["prompts"], gen.batch["attention_mask"]
        width = prompts.shape[1]
        responses, response_mask = gen.batch["responses"], gen.batch["response_mask"]
        rollouts.append(
            {
                "prompt_ids": [
                    p[m[:width].bool()].tolist() for p, m in zip(prompts, mask, strict=True)
                ],
                "completion_ids": [
                    r[m.bool()].tolist() for r, m in zip(responses, response_mask, strict=True)
                ],
            }
        )
        return gen

    trainer.arr.generate_sequences = keep_rollout  # type: ignore[method-assign]
    status = trainer.fit()
    if status != "succeeded" or len(weights) != args.steps:
        raise RuntimeError(f"the engine's run ended {status} after {len(weights)} steps")
    return {"initial": initial, "rollouts": rollouts, "weights": weights, "metrics": logged}


def run_trl(
    args: argparse.Namespace,
    task: Any,
    engine: dict[str, Any],
    *,
    nudge: bool = False,
    bias_corrected_kl: bool = False,
) -> dict[str, Any]:
    """Train with TRL on the engine's completions; return its initial weights and per-step ones.

    With ``nudge`` every policy weight starts one unit in the last place up or down (at random;
    the reference keeps the exact weights): a run that differs from the plain one by the least
    a float can, which shows how far rounding alone carries two runs apart (the control). With
    ``bias_corrected_kl`` TRL keeps its own default KL gradient (the benchmark turns it off to
    match verl's k3 loss): a real but small difference, to show what one looks like here.
    """
    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.training.compare_arms import check_trl_prompt_ids, trl_config, trl_inputs

    tokenizer, dataset, reward_fn = trl_inputs(args, task)
    rollouts = engine["rollouts"]
    weights: list[Weights] = []

    class ReplayGRPOTrainer(GRPOTrainer):
        """Completes each prompt with the engine's completion of the same step and row."""

        def _generate_single_turn(self, prompt_ids: list, *_: Any, **__: Any) -> Any:
            step = rollouts[self.state.global_step]
            asked = [list(ids) for ids in prompt_ids]
            if asked != step["prompt_ids"]:
                raise RuntimeError(
                    f"step {self.state.global_step + 1}: TRL asks for other prompts than the "
                    f"engine sampled (first: {asked[0]} vs {step['prompt_ids'][0]})"
                )
            return step["completion_ids"], None

    class Keep(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            weights.append(snapshot(trainer.model))

    torch.manual_seed(args.seed)
    config = trl_config(args, Path(args.root) / "replay" / "trl")
    config["use_bias_correction_kl"] = bias_corrected_kl
    trainer = ReplayGRPOTrainer(
        model=task.model_dir,
        reward_funcs=reward_fn,
        args=GRPOConfig(**config),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Keep()],
    )
    trainer.remove_callback(PrinterCallback)  # the comparison prints what matters
    check_trl_prompt_ids(trainer, tokenizer, task)
    initial = snapshot(trainer.model)
    if nudge:
        generator = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            for p in trainer.model.parameters():
                up = torch.rand(p.shape, generator=generator) < 0.5
                p.copy_(torch.nextafter(p, torch.where(up, torch.inf, -torch.inf)))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    return {
        "initial": initial,
        "weights": weights,
        "metrics": [run_metrics(h["reward"], h.get("kl"), h.get("grad_norm")) for h in logs],
    }


def run_metrics(reward: float, kl: float | None, grad_norm: float | None) -> dict[str, Any]:
    """Return the metrics both frameworks log for a step, under one set of names."""
    return {"reward": reward, "kl": kl, "grad_norm": grad_norm}


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Return, per step, how far run ``b``'s weights and updates are from run ``a``'s."""
    import torch

    if difference(a["initial"], b["initial"]).abs().max() != 0.0:
        raise RuntimeError("the two runs did not start from the same weights")
    rows = []
    previous = (a["initial"], b["initial"])
    for index, (wa, wb) in enumerate(zip(a["weights"], b["weights"], strict=True), start=1):
        ours, theirs = difference(wa, previous[0]), difference(wb, previous[1])
        gap = difference(wa, wb)
        rows.append(
            {
                "step": index,
                "update_cosine": float(torch.nn.functional.cosine_similarity(ours, theirs, dim=0)),
                "update_norm_ratio": float(theirs.norm() / ours.norm()),
                "gap_over_drift": float(gap.norm() / difference(wa, a["initial"]).norm()),
                "largest_gap": float(gap.abs().max()),
                **{
                    key: (a["metrics"][index - 1][key], b["metrics"][index - 1][key])
                    for key in ("reward", "kl", "grad_norm")
                },
            }
        )
        previous = (wa, wb)
    return rows


def markdown(rows: list[dict[str, Any]], names: tuple[str, str]) -> str:
    """Return the per-step table of a comparison."""

    def pair(values: tuple[Any, Any]) -> str:
        return " / ".join("" if v is None else f"{v:.4g}" for v in values)

    lines = [
        f"| step | update cosine | update norm {names[1]} / {names[0]} | weight gap / drift "
        f"| largest gap | reward ({names[0]} / {names[1]}) | KL | grad norm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['update_cosine']:.6f} | {r['update_norm_ratio']:.5f} "
            f"| {r['gap_over_drift']:.2e} | {r['largest_gap']:.2e} | {pair(r['reward'])} "
            f"| {pair(r['kl'])} | {pair(r['grad_norm'])} |"
        )
    return "\n".join(lines)


COMPARISONS = {
    "engine": (
        "TRL",
        "engine",
        "TRL against the engine (the engine's completions, each framework's update)",
    ),
    "control": (
        "TRL",
        "TRL nudged",
        "Control: TRL against itself started one unit in the last place away",
    ),
    "trl_default_kl": (
        "TRL",
        "TRL default KL",
        "TRL against TRL with its default KL gradient (use_bias_correction_kl=True), which verl's "
        "k3 loss does not have",
    ),
}


def replay(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Run the engine, then TRL three ways on its completions; return the per-step comparisons."""
    from bench.training.compare_tasks import prepare_task

    task, _ = prepare_task(args.scale, Path(args.root), args.threads)
    engine = run_engine(args, task)
    trl = run_trl(args, task, engine)
    return {
        "engine": compare(trl, engine),
        "control": compare(trl, run_trl(args, task, engine, nudge=True)),
        "trl_default_kl": compare(trl, run_trl(args, task, engine, bias_corrected_kl=True)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    comparisons = replay(args)
    for key, rows in comparisons.items():
        first, second, title = COMPARISONS[key]
        print(f"{title}:\n\n{markdown(rows, (first, second))}\n")
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"replay_trl_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), **comparisons}, indent=1))
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
