"""The rewards besides the reward model: ``custom_reward_function``, PostTrain's ``reward``
composition and verl 0.7's ``reward_manager``, and the rules of them all together.

The rules: how the components combine with the reward model (``engine.config.reward_model``) and
the custom function, what each reward manager reads (its ``reward_kwargs``, DAPO's overlong
penalty, the SandboxFusion service of the code reward), and, through the reward model's module,
what the model needs and where it runs.
"""

import math
from dataclasses import dataclass
from typing import Any

from engine.config.fields import (
    MAX_WORKERS,
    ConfigFieldError,
    Validation,
    _f,
    _refused,
    _Section,
    _section,
    _target,
)
from engine.config.files import file_problems
from engine.config.judge import judge_problems
from engine.config.reward_kwargs import reward_kwargs_problems
from engine.config.reward_model import (
    RewardModelConfig,
    in_process_reward_model_problems,
    reward_model_folder_problems,
    reward_pool_problems,
)
from engine.config.tree import get_in
from engine.config.unsupported import ModuleConfig
from engine.rewards.endpoints import endpoint_problem
from engine.rewards.names import REWARD_COMPONENTS


@dataclass
class CustomRewardFunctionConfig(_Section):
    path: str | None = _f(None, "Python file with a reward function.", resource="code")
    name: str = _f("compute_score", "Function name in that file.")
    reward_kwargs: dict[str, Any] = _f({}, "Extra keyword arguments for the function.")


@dataclass
class RewardComponent(_Section):
    name: str = _f("", "Registered reward function.", choices=REWARD_COMPONENTS)
    weight: float = _f(1.0, "Weight in the sum.")
    kwargs: dict[str, Any] = _f({}, "Keyword arguments for the function.")


@dataclass
class RewardConfig(_Section):
    num_workers: int = _f(1, "Processes scoring responses in parallel.", gt=0, le=MAX_WORKERS)
    components: list[RewardComponent] = _f(
        [], "Weighted sum of rewards; empty: dispatch by data_source (or the custom function)."
    )


@dataclass
class RewardManagerConfig(_Section):
    _target_: str = _target("verl.trainer.config.config.RewardManagerConfig")
    source: str = _refused(
        "register",
        "Where the reward manager comes from: register or importlib.",
        "only registered reward managers exist here; keep register",
    )
    name: str | None = _f(
        None,
        "Reward manager; null: reward_model.reward_manager.",
        follows="reward_model.reward_manager",
    )
    module: ModuleConfig = _section(ModuleConfig, "A custom reward manager module.")


def reward_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the reward keys: what the reward model needs, how the components, the
    reward model and the custom function combine, what the reward manager reads, and the reward
    model's pool; warn when DAPO's overlong penalty can never apply."""
    cfg = v.cfg
    rm: RewardModelConfig = cfg.reward_model
    custom: CustomRewardFunctionConfig = cfg.custom_reward_function
    errors = []
    if rm.enable and not rm.model.path:
        errors.append(
            ConfigFieldError(
                "reward_model.model.path",
                rm.model.path,
                "reward_model.enable=True needs a reward model folder (tiny://reward_model: the "
                "embedded one)",
            )
        )
    if rm.enable and rm.micro_batch_size_per_gpu is None and not rm.use_reward_loop:
        errors.append(
            ConfigFieldError(
                "reward_model.micro_batch_size_per_gpu",
                None,
                "verl's legacy reward model worker (use_reward_loop=False) needs the samples "
                "per reward-model forward; set reward_model.micro_batch_size_per_gpu (or verl's "
                "deprecated micro_batch_size), or use the reward loop (use_reward_loop=True)",
            )
        )
    if rm.enable and custom.path and not cfg.reward.components:
        errors.append(
            ConfigFieldError(
                "reward.components",
                cfg.reward.components,
                "reward_model.enable=True and custom_reward_function.path both give the reward; "
                "combine them with reward.components=[{name: custom, weight: ...}, {name: "
                "reward_model, weight: ...}], or drop one",
            )
        )
    errors += _component_problems(v)
    errors += reward_pool_problems(cfg)
    if cfg.trainer.controller != "ray":
        errors += in_process_reward_model_problems(cfg, cfg.trainer.device)
    errors += _manager_problems(v)
    errors += _reward_kwargs_problems(v)
    errors += _sandbox_fusion_problems(v)
    errors += judge_problems(v)
    errors += reward_model_folder_problems(v)
    if v.check_files and custom.path:
        errors += file_problems(
            v, "custom_reward_function.path", custom.path, "point it at a Python file"
        )
    return errors


def _component_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``reward.components``: each one's weight and what its name needs, and
    a custom function or a reward model that no component scores with."""
    cfg = v.cfg
    errors = []
    for i, component in enumerate(cfg.reward.components):
        key = f"reward.components[{i}]"
        if not math.isfinite(component.weight):
            errors.append(
                ConfigFieldError(f"{key}.weight", component.weight, "must be a finite number")
            )
        if component.name == "custom" and not cfg.custom_reward_function.path:
            errors.append(
                ConfigFieldError(
                    f"{key}.name",
                    "custom",
                    "custom needs custom_reward_function.path (a Python file)",
                )
            )
        if component.name == "reward_model" and not cfg.reward_model.enable:
            errors.append(
                ConfigFieldError(
                    f"{key}.name", "reward_model", "reward_model needs reward_model.enable=True"
                )
            )
        if component.name == "reward_model" and component.kwargs:
            errors.append(
                ConfigFieldError(
                    f"{key}.kwargs",
                    component.kwargs,
                    "a reward-model component takes no kwargs: the model scores each (prompt, "
                    "response) pair as it is; remove them",
                )
            )
    names = {component.name for component in cfg.reward.components}
    if names and cfg.custom_reward_function.path and "custom" not in names:
        errors.append(
            ConfigFieldError(
                "custom_reward_function.path",
                cfg.custom_reward_function.path,
                "is set, but reward.components has no custom component, so the function would "
                "score nothing; add {name: custom, weight: ...} to reward.components, or unset "
                "custom_reward_function.path",
            )
        )
    if names and cfg.reward_model.enable and "reward_model" not in names:
        errors.append(
            ConfigFieldError(
                "reward_model.enable",
                True,
                "loads the reward model, but reward.components has no reward_model component, so "
                "its score would count nowhere; add {name: reward_model, weight: ...} to "
                "reward.components, or set reward_model.enable=False",
            )
        )
    return errors


def _manager_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of what the prime and batch managers score with: one function, and
    batch's one call."""
    cfg = v.cfg
    manager = cfg.reward_model.reward_manager
    if manager not in ("prime", "batch", "remote"):
        return []
    which, errors = f"reward_model.reward_manager={manager}", []
    scores_with = {
        "prime": "one reward function (custom_reward_function or the data_source dispatch)",
        "batch": "one reward function (custom_reward_function)",
        "remote": "its reward service (reward_kwargs.endpoint)",
    }[manager]
    if cfg.reward.components:
        errors.append(
            ConfigFieldError(
                "reward.components",
                cfg.reward.components,
                f"are not read by {which}, which scores with {scores_with}; weighted "
                "components need reward_model.reward_manager=naive or dapo",
            )
        )
    if cfg.reward_model.enable:
        errors.append(
            ConfigFieldError(
                "reward_model.enable",
                True,
                f"loads the reward model, which {which} does not score with; use "
                "reward_model.reward_manager=naive (the model's score is the reward) or dapo",
            )
        )
    if manager == "remote":
        return errors + _remote_manager_problems(v)
    if manager != "batch":
        return errors
    custom = cfg.custom_reward_function
    if not custom.path:
        errors.append(
            ConfigFieldError(
                "reward_model.reward_manager",
                manager,
                "batch calls custom_reward_function once per batch; set "
                "custom_reward_function.path and .name to a function compute_score(data_sources, "
                "solution_strs, ground_truths, extra_infos, **kwargs) returning one score per "
                "response",
            )
        )
    if cfg.reward.num_workers != 1:
        errors.append(
            ConfigFieldError(
                "reward.num_workers",
                cfg.reward.num_workers,
                "has no effect with reward_model.reward_manager=batch, which makes one call in "
                "the trainer's process (a batch function parallelises itself); set it to 1",
            )
        )
    for key in sorted(cfg.reward_model.reward_kwargs.keys() & (custom.reward_kwargs or {}).keys()):
        errors.append(
            ConfigFieldError(
                f"reward_model.reward_kwargs.{key}",
                cfg.reward_model.reward_kwargs[key],
                "is also set in custom_reward_function.reward_kwargs, and batch passes both to "
                "the function; keep one",
            )
        )
    return errors


def _sandbox_fusion_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``reward_model.sandbox_fusion.url``: an allowed service, read by a
    manager whose code reward runs tests."""
    cfg, key = v.cfg, "reward_model.sandbox_fusion.url"
    url = cfg.reward_model.sandbox_fusion.url
    if url is None:
        return []
    why = endpoint_problem(url)
    if why is not None:
        return [ConfigFieldError(key, url, why)]
    manager = cfg.reward_model.reward_manager
    if manager in ("batch", "remote"):
        return [
            ConfigFieldError(
                key,
                url,
                f"is read by the code reward, which reward_model.reward_manager={manager} does "
                "not call; use naive, dapo or prime, or unset the url",
            )
        ]
    return []


def _remote_manager_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of what the remote manager does not read: a custom function and
    reward.num_workers (its requests are threads, bounded by reward_kwargs.max_concurrent)."""
    cfg, errors = v.cfg, []
    if cfg.custom_reward_function.path:
        errors.append(
            ConfigFieldError(
                "custom_reward_function.path",
                cfg.custom_reward_function.path,
                "is not called by reward_model.reward_manager=remote, which scores with its "
                "reward service; unset it, or use reward_manager=batch to call the function",
            )
        )
    if cfg.reward.num_workers != 1:
        errors.append(
            ConfigFieldError(
                "reward.num_workers",
                cfg.reward.num_workers,
                "has no effect with reward_model.reward_manager=remote, whose requests in "
                "flight are +reward_model.reward_kwargs.max_concurrent; set it to 1",
            )
        )
    return errors


def _reward_kwargs_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of ``reward_model.reward_kwargs`` for its manager, and of DAPO's overlong
    penalty as verl's recipe spells it (``reward_model.overlong_buffer``)."""
    cfg = v.cfg
    manager = cfg.reward_model.reward_manager
    kwargs = dict(cfg.reward_model.reward_kwargs)
    problems = reward_kwargs_problems(manager, kwargs)
    errors = [
        ConfigFieldError(key, get_in(kwargs, key.split(".")[2:])[1], message)
        for key, message in problems
    ]
    buffer = kwargs.get("overlong_buffer_cfg") or {}
    longest = cfg.data.max_response_length
    start = kwargs.get("max_resp_len", 0) - buffer.get("len", 0)
    if not problems and manager == "dapo" and buffer.get("enable") and start >= longest:
        v.warnings.append(
            f"reward_model.reward_kwargs: the overlong penalty starts after max_resp_len - len "
            f"= {start} tokens, but no response is longer than data.max_response_length="
            f"{longest}, so it never applies"
        )
    recipe, key = cfg.reward_model.overlong_buffer, "reward_model.overlong_buffer"
    if recipe.enable and manager != "dapo":
        errors.append(
            ConfigFieldError(
                f"{key}.enable", True, "is read by reward_model.reward_manager=dapo; set it"
            )
        )
    if recipe.enable and buffer.get("enable"):
        errors.append(
            ConfigFieldError(
                f"{key}.enable",
                True,
                "and reward_model.reward_kwargs.overlong_buffer_cfg are two spellings of one "
                "penalty; keep one",
            )
        )
    if recipe.enable and not 0 < recipe.len <= longest:
        errors.append(
            ConfigFieldError(
                f"{key}.len",
                recipe.len,
                f"must be > 0 and at most data.max_response_length={longest} when enabled",
            )
        )
    return errors
