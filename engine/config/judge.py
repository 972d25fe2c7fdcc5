"""The generative judge (``reward_model.judge``): a causal LM that reads each response through
a prompt template and whose reply is parsed into the score (``engine.rewards.judge``).

Its section and its rules: the template's fields, the parser, the backend that serves it, what it
needs of ``reward_model``, and the rate keys only a judge reads.
"""

import importlib.util
import json
from dataclasses import dataclass
from typing import Any

from engine.config.fields import ConfigFieldError, Validation, _f, _Section
from engine.config.files import local_path
from engine.rewards.judge_prompt import (
    DEFAULT_VERDICTS,
    JUDGE_FIELDS,
    JUDGE_PARSERS,
    build_parser,
    template_problem,
)


@dataclass
class JudgeConfig(_Section):
    prompt_template: str | None = _f(
        None,
        "Makes the reward model (model.path: a causal LM folder) a generative judge: this "
        "prompt, with the fields " + ", ".join("{" + f + "}" for f in JUDGE_FIELDS) + " filled "
        "in per sample ({{ and }} for a literal brace), is generated through reward_model."
        "rollout.name and its reply parsed into the score; the reply is kept per sample. null: "
        "the reward model is a one-label sequence classifier.",
    )
    parser: str = _f(
        "number",
        "How the judge's reply becomes a score: number (the last number in it), verdict (the "
        "last word of verdicts in it) or boxed (the last \\boxed{} value: a number, or a "
        "verdict word). A reply with none is that sample's reward error.",
        choices=JUDGE_PARSERS,
    )
    verdicts: dict[str, Any] = _f(
        dict(DEFAULT_VERDICTS),
        "Verdict word to score, matched as a whole word ignoring case (parser=verdict, or a "
        "word in \\boxed{} with parser=boxed).",
    )
    temperature: float = _f(
        0.0,
        "Sampling temperature of the judge's reply; 0: greedy (the same reply each time).",
        ge=0,
    )


JUDGE_BACKENDS = ("hf", "vllm")
_JUDGE_ONLY = ("max_rpm", "max_tpm")


def judge_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of a generative judge: its template, its parser, its backend, what it
    needs, and the rate keys only it reads."""
    cfg, errors = v.cfg, []
    rm = cfg.reward_model
    judge, key = rm.judge, "reward_model.judge"
    if not judge.prompt_template:
        errors += [
            ConfigFieldError(
                f"reward_model.{name}",
                getattr(rm, name),
                "limits a generative judge's requests, but reward_model.judge.prompt_template is "
                "not set; set the judge's prompt, or unset it",
            )
            for name in _JUDGE_ONLY
            if getattr(rm, name) is not None
        ]
        # verl's reward-loop examples name a server for a classifier; here only a judge has one.
        unread = [
            f"reward_model.rollout.{name}={getattr(rm.rollout, name)!r}"
            for name, default in (
                ("name", None),
                ("prompt_length", 2048),
                ("response_length", 2048),
            )
            if getattr(rm.rollout, name) != default
        ]
        if unread:
            v.warnings.append(
                f"no effect without a generative judge (reward_model.judge.prompt_template): "
                f"{', '.join(unread)}; a sequence-classifier reward model scores with "
                "transformers, not a server"
            )
        return errors
    if not rm.enable or not rm.model.path:
        errors.append(
            ConfigFieldError(
                f"{key}.prompt_template",
                judge.prompt_template,
                "makes the reward model a judge, which needs reward_model.enable=True and "
                "reward_model.model.path set to the judge's folder (a causal LM, e.g. tiny://model)",
            )
        )
    problem = template_problem(judge.prompt_template)
    if problem is not None:
        errors.append(ConfigFieldError(f"{key}.prompt_template", judge.prompt_template, problem))
    try:
        build_parser(judge.parser, judge.verdicts)
    except ValueError as exc:
        errors.append(
            ConfigFieldError(
                f"{key}.verdicts",
                judge.verdicts,
                f"cannot build the {judge.parser} parser: {exc}",
            )
        )
    backend = rm.rollout.name
    if backend is not None and backend not in JUDGE_BACKENDS:
        errors.append(
            ConfigFieldError(
                "reward_model.rollout.name",
                backend,
                f"serves the judge, and the judge's backends are {', '.join(JUDGE_BACKENDS)} "
                "(null: hf)",
            )
        )
    elif backend == "vllm" and importlib.util.find_spec("vllm") is None:
        errors.append(
            ConfigFieldError(
                "reward_model.rollout.name",
                backend,
                "vLLM is not installed here; install it (pip install vllm) or serve the judge "
                "with hf",
            )
        )
    if cfg.trainer.controller == "ray":
        # With either controller the judge generates in the trainer's own process (the single
        # controller), so the keys of the reward model's Ray role have nothing to act on.
        ray_role_only = {
            "reward_model.enable_resource_pool": rm.enable_resource_pool,
            "reward_model.model.fsdp_config.param_offload": rm.model.fsdp_config.param_offload,
        }
        errors += [
            ConfigFieldError(
                name,
                value,
                "places the reward model's Ray role, but a generative judge generates in the "
                f"trainer's own process (the single controller); set {name}=False",
            )
            for name, value in ray_role_only.items()
            if value
        ]
    return errors


def causal_lm_problems(v: Validation, value: str) -> list[ConfigFieldError]:
    """Return an error when a local judge folder is not a causal language model."""
    path = local_path(v, "reward_model.model.path", value)
    if path is None or not (path / "config.json").is_file():
        return []  # remote, tiny://, or already reported by model_dir_problems
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError) as exc:
        return [
            ConfigFieldError(
                "reward_model.model.path", value, f"{path}/config.json cannot be read: {exc}"
            )
        ]
    if not any(a.endswith("ForCausalLM") for a in architectures):
        return [
            ConfigFieldError(
                "reward_model.model.path",
                value,
                f"{path} is not a causal language model (architectures={architectures}), and "
                "reward_model.judge generates the judge's reply with it; point it at a "
                "...ForCausalLM folder, or unset reward_model.judge.prompt_template to score with "
                "a sequence classifier",
            )
        ]
    return []
