"""What a trainer is built from: its data, its reward managers and its local workers.

Plain functions of the config, called once by ``PPOTrainer`` before the loop starts (verl's
``RayPPOTrainer.__init__``, ``_create_dataloader`` and ``init_workers``, and ``main_ppo``'s
reward-manager factory). The datasets are read here, before any model loads, so a malformed line
fails fast. ``RayPPOTrainer`` builds the same data and reward managers and its own Ray workers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.algorithms.kl import KLController, get_kl_controller
from engine.config import ConfigValidationError, ModelConfig, PPOConfig
from engine.config.fields import resolved
from engine.config.files import paths_of
from engine.config.keys import config_to_dict
from engine.config.reward_model import in_process_reward_model_problems, uses_judge
from engine.data.custom import CustomPrompts, build_custom_dataset, build_sampler, dataset_class
from engine.data.dataset import PromptDataset, RLHFDataset
from engine.data.loader import PromptDataLoader
from engine.distributed.local_group import LocalWorkerGroup
from engine.distributed.worker_group import ActorRolloutRefGroup, CriticGroup
from engine.rewards.custom import load_custom_reward_fn
from engine.rewards.dapo import DAPORewardManager
from engine.rewards.default import default_compute_score
from engine.rewards.managers import REWARD_MANAGER_CLASSES
from engine.rewards.overlong import OverlongBuffer, overlong_buffer
from engine.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.roles.critic import CriticWorker
from engine.roles.judge_model import load_judge
from engine.roles.model_loading import load_reward_model, load_tokenizer, resolve_path
from engine.roles.protocols import ActorRolloutRef, Critic


def uses_critic(config: PPOConfig) -> bool:
    """Return True when a value model trains: ``critic.enable``, or unset with GAE."""
    enable = config.critic.enable
    return config.algorithm.adv_estimator == "gae" if enable is None else bool(enable)


def uses_reference(config: PPOConfig) -> bool:
    """Return True when a reference policy scores: a KL loss or a KL penalty in the reward."""
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


# -- data -------------------------------------------------------------------------------------
def resolve_files(files: str | Sequence[str]) -> list[str]:
    """Return local paths for ``data.train_files`` / ``data.val_files`` (str or list)."""
    items = [files] if isinstance(files, str) else list(files)
    return [resolve_path(f) for f in items]


def load_data_tokenizer(config: PPOConfig, policy_tokenizer: Any) -> Any:
    """Return the tokenizer that reads the data: ``data.tokenizer`` when set, else the policy's.

    The prompt ids it produces are fed to the policy, so its vocabulary must be the policy's
    (token for token); only its chat template and settings may differ. ``custom_chat_template``
    applies to it as to the policy's tokenizer.
    """
    path = config.data.tokenizer
    if not path:
        return policy_tokenizer
    settings = ModelConfig(
        path=path,
        trust_remote_code=config.data.trust_remote_code,
        custom_chat_template=config.actor_rollout_ref.model.custom_chat_template,
    )
    tokenizer = load_tokenizer(settings, path=path)
    data_vocab, policy_vocab = tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if data_vocab != policy_vocab:
        differ = sorted(
            token
            for token in data_vocab.keys() | policy_vocab.keys()
            if data_vocab.get(token) != policy_vocab.get(token)
        )
        raise ValueError(
            f"data.tokenizer={path!r} has a different vocabulary from the policy's tokenizer "
            f"({len(data_vocab)} vs {len(policy_vocab)} tokens; {len(differ)} differ, e.g. "
            f"{differ[:3]}), so the prompt ids would mean other tokens to the model; point "
            "data.tokenizer at a tokenizer with the policy's vocabulary, or unset it"
        )
    return tokenizer


def verl_data_config(config: PPOConfig) -> Any:
    """Return the ``data`` section as verl hands it to a dataset or sampler class: an OmegaConf
    ``DictConfig`` (``config.get(key, default)``, attribute and item access)."""
    from omegaconf import OmegaConf

    return OmegaConf.create(config_to_dict(config)["data"])


def build_datasets(config: PPOConfig, tokenizer: Any) -> tuple[PromptDataset, PromptDataset | None]:
    """Return the training dataset and the validation one (None without ``data.val_files``):
    ``RLHFDataset``, or the class ``data.custom_cls`` names (``engine.data.custom``)."""
    data = config.data
    custom = data.custom_cls
    custom_cls = dataset_class(custom.path, custom.name) if custom.path else None

    def dataset(files: Sequence[str], max_samples: int) -> PromptDataset:
        if custom_cls is None:
            return RLHFDataset(
                resolve_files(files), tokenizer, data, max_samples=max_samples, names=list(files)
            )
        return build_custom_dataset(
            custom_cls,
            resolve_files(files),
            tokenizer,
            verl_data_config(config),
            max_samples=max_samples,
            prompt_settings=data,
        )

    resolved(data.train_files, "data.train_files")  # null: an error naming the key
    train = dataset(paths_of(data.train_files), data.train_max_samples)
    val = dataset(paths_of(data.val_files), data.val_max_samples) if data.val_files else None
    if config.trainer.val_only and val is None:
        raise ValueError(
            "trainer.val_only=True validates and stops, but data.val_files is not set; "
            "set data.val_files or drop trainer.val_only"
        )
    return train, val


def build_train_loader(config: PPOConfig, dataset: PromptDataset, collate: Any) -> PromptDataLoader:
    """Return the training loader: ``data.gen_batch_size`` (else ``train_batch_size``) prompts a
    batch, full batches only, in ``data.sampler``'s order, else shuffled with ``data.seed``.

    A custom dataset's sampler sees the user's dataset (``CustomPrompts.source``), as in verl.
    """
    data = config.data
    sampler = None
    if data.sampler.class_path:
        source = dataset.source if isinstance(dataset, CustomPrompts) else dataset
        sampler = build_sampler(
            data.sampler.class_path, data.sampler.class_name, source, verl_data_config(config)
        )
    return PromptDataLoader(
        dataset,
        data.gen_batch_size or data.train_batch_size,
        shuffle=data.shuffle,
        seed=resolved(data.seed, "data.seed"),
        drop_last=True,
        collate_fn=collate,
        sampler=sampler,
    )


def total_training_steps(config: PPOConfig, batches_per_epoch: int) -> int:
    """Return ``trainer.total_training_steps``, else ``total_epochs`` times the epoch's batches."""
    steps = config.trainer.total_training_steps
    return int(steps) if steps else config.trainer.total_epochs * batches_per_epoch


def build_kl_controller(config: PPOConfig) -> KLController | None:
    """Return the KL-in-reward coefficient's controller (``algorithm.kl_ctrl``), or None
    without ``algorithm.use_kl_in_reward``."""
    algorithm = config.algorithm
    return get_kl_controller(algorithm.kl_ctrl) if algorithm.use_kl_in_reward else None


# -- workers ----------------------------------------------------------------------------------
def check_critic_checkpoint(config: PPOConfig, device: torch.device) -> None:
    """Raise ValueError when a sharded critic is asked to save a Hugging Face folder."""
    sharded = config.trainer.controller == "ray" or device.type == "cuda"
    if uses_critic(config) and sharded and "hf_model" in config.critic.checkpoint.save_contents:
        raise ValueError(
            "critic.checkpoint.save_contents=[..., hf_model]: a sharded critic (trainer."
            "controller=ray or a CUDA device) cannot write a Hugging Face folder yet; drop "
            "hf_model from critic.checkpoint.save_contents"
        )


def build_local_workers(
    config: PPOConfig, device: torch.device, tokenizer: Any, total_steps: int
) -> tuple[ActorRolloutRef, Critic | None]:
    """Return the actor-rollout-reference worker and, when one trains, the critic worker, as
    plain objects in this process (a CPU run)."""
    worker = ActorRolloutRefWorker(
        config, device=device, total_steps=total_steps, need_ref=uses_reference(config)
    )
    worker.tokenizer = tokenizer
    critic = (
        CriticWorker(config, device=device, total_steps=total_steps)
        if uses_critic(config)
        else None
    )
    return worker, critic


def build_local_rank(
    config: PPOConfig, device: torch.device, total_steps: int
) -> tuple[LocalWorkerGroup, ActorRolloutRef, Critic | None]:
    """Return a one-rank group in this process and the role proxies on it (a one-GPU run).

    The workers are FSDP2 ranks of that group, as in a one-GPU verl run
    (``engine.distributed.local_group``): bf16 compute with fp32 master weights, the rollout
    sampling from a bf16 copy.
    """
    group = LocalWorkerGroup(device.type)
    arr = ActorRolloutRefGroup(
        group, config, total_steps=total_steps, need_ref=uses_reference(config)
    )
    critic = CriticGroup(group, config, total_steps=total_steps) if uses_critic(config) else None
    return group, arr, critic


# -- rewards ----------------------------------------------------------------------------------
def build_reward_scorer(config: PPOConfig, device: str | torch.device = "cpu") -> Any:
    """Return the reward model's scorer in this process when ``reward_model.enable=True``, else
    None (``engine.roles.model_loading.load_reward_model``: sizes and defaults as verl's reward model
    worker; with ``reward_model.judge.prompt_template`` a generative judge,
    ``engine.roles.judge_model.load_judge``).

    The single-process trainer's; with ``trainer.controller=ray`` the model is a role on the
    ranks instead (``engine.distributed.worker_group.RewardModelGroup``). Raise
    ``ConfigValidationError`` for the keys only that role reads (the validator's
    ``in_process_reward_model_problems``).
    """
    if not config.reward_model.enable:
        return None
    problems = in_process_reward_model_problems(config, torch.device(device).type)
    if problems:
        raise ConfigValidationError(problems)
    if uses_judge(config):  # a generative judge (engine.rewards.judge)
        return load_judge(config, device)
    return load_reward_model(
        config, device, offload=config.reward_model.model.fsdp_config.param_offload
    )


def build_reward_manager(
    config: PPOConfig,
    tokenizer: Any,
    *,
    device: str | torch.device = "cpu",
    validation: bool = False,
    scorer: Any = None,
) -> Any:
    """Return the reward manager the config describes (custom function, composite or dispatch).

    With ``reward_model.enable=True`` the reward model is ``scorer`` (anything with
    ``score(prompts, responses)``, such as the Ray path's ``RewardModelGroup``) or, without one,
    a ``RewardModelScorer`` loaded here on ``device``; with no
    ``reward.components`` its score is the reward, as in verl (whose reward manager returns the
    reward model's ``rm_scores`` when the batch has them); a ``reward_model`` component weighs it
    against rule rewards, and a ``custom`` component is ``custom_reward_function``. With
    ``validation=True`` the reward model is left out, as verl's ``val_reward_fn`` leaves it: the
    other components score, or the data-source dispatch when none is left.
    """
    custom = config.custom_reward_function
    compute_score: Callable[..., Any] | None = None
    if custom.path:
        compute_score = load_custom_reward_fn(
            resolve_path(custom.path), custom.name, dict(custom.reward_kwargs or {})
        )
    components = [
        (c["name"], float(c.get("weight", 1.0)), dict(c.get("kwargs") or {}))
        if isinstance(c, dict)
        else (c.name, float(c.weight), dict(c.kwargs or {}))
        for c in (config.reward.components or [])
    ]
    if any(name == "custom" for name, _, _ in components):
        components = [(compute_score if c[0] == "custom" else c[0], *c[1:]) for c in components]
        compute_score = None
    fusion = config.reward_model.sandbox_fusion
    if fusion.url:  # the code reward's tests go to SandboxFusion (engine.rewards.sandbox_fusion)
        sandbox_fusion = {
            "url": fusion.url,
            "max_concurrent": fusion.max_concurrent,
            "memory_limit_mb": fusion.memory_limit_mb,
        }
        if compute_score is None and not components:
            compute_score = functools.partial(default_compute_score, sandbox_fusion=sandbox_fusion)
        components = [
            (name, weight, {**kwargs, "sandbox_fusion": sandbox_fusion})
            if name in ("default", "code_exec")
            else (name, weight, kwargs)
            for name, weight, kwargs in components
        ]
    model = None
    if validation:
        components = [c for c in components if c[0] != "reward_model"]
    elif config.reward_model.enable:
        model = scorer if scorer is not None else build_reward_scorer(config, device)
    settings: dict[str, Any] = {
        "compute_score": compute_score,
        "reward_fn_key": config.data.reward_fn_key,
        "num_workers": config.reward.num_workers,
        "components": components or None,
        "reward_model": model,
    }
    if config.reward_model.reward_manager == "dapo":
        overlong = overlong_buffer(dict(config.reward_model.reward_kwargs or {}))
        recipe = config.reward_model.overlong_buffer  # verl's DAPO recipe spelling
        if recipe.enable:
            overlong = OverlongBuffer(
                config.data.max_response_length, recipe.len, recipe.penalty_factor, recipe.log
            )
        return DAPORewardManager(tokenizer, overlong=overlong, **settings)
    manager = REWARD_MANAGER_CLASSES[config.reward_model.reward_manager]
    return manager(tokenizer, **settings, **dict(config.reward_model.reward_kwargs or {}))


def build_reward_managers(
    config: PPOConfig, tokenizer: Any, *, device: str | torch.device = "cpu", scorer: Any = None
) -> tuple[Any, Any]:
    """Return the training and validation reward managers (verl's ``reward_fn``,
    ``val_reward_fn``).

    ``scorer`` is a reward model that lives elsewhere (the Ray path's worker-group proxy);
    without one, ``reward_model.enable=True`` loads the model here, on ``device``. Validation
    leaves the reward model out; without one it shares the training manager.
    """
    reward_fn = build_reward_manager(config, tokenizer, device=device, scorer=scorer)
    val_reward_fn = (
        build_reward_manager(config, tokenizer, validation=True)
        if config.reward_model.enable
        else reward_fn
    )
    return reward_fn, val_reward_fn
