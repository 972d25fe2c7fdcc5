"""Rollout engines by ``actor_rollout_ref.rollout.name``: a registry, as verl keeps one.

``hf`` is the lean sampling loop over the policy module itself (CPU and GPU); ``vllm`` and
``sglang`` adapters around a vLLM (CPU and GPU) or SGLang (GPU) engine that loads the model from
``model.path``. A backend is a function ``(model, tokenizer, rollout_config, model_path, *,
seed, model_overrides) -> RolloutEngine`` (``seed`` seeds an engine's own sampler; ``hf`` draws
from the worker's generator instead; ``model_overrides`` are the config attributes
the policy's ``model.override_config`` changed, which a served engine applies to the model it
builds); :func:`register_rollout` adds one under a name in
``engine.rollout.names.ROLLOUT_NAMES`` (the config's choices come from that list, so the two
cannot drift). Importing this package loads no backend: each builder imports its module when
called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.rollout.names import ROLLOUT_NAMES

if TYPE_CHECKING:
    from engine.config import RolloutConfig

RolloutBuilder = Callable[..., Any]
_BUILDERS: dict[str, RolloutBuilder] = {}


def register_rollout(name: str) -> Callable[[RolloutBuilder], RolloutBuilder]:
    """Register a rollout backend under ``name`` (which must be listed in ROLLOUT_NAMES)."""

    def decorate(builder: RolloutBuilder) -> RolloutBuilder:
        if name not in ROLLOUT_NAMES:
            raise ValueError(
                f"rollout backend {name!r} is not listed in engine.rollout.names.ROLLOUT_NAMES; "
                "add it there so the config accepts it"
            )
        if name in _BUILDERS:
            raise ValueError(f"rollout backend {name!r} is registered twice")
        _BUILDERS[name] = builder
        return builder

    return decorate


def get_rollout_builder(name: str) -> RolloutBuilder:
    """Return the builder of backend ``name``; ValueError naming the backends otherwise."""
    if name not in _BUILDERS:
        raise ValueError(
            f"unknown actor_rollout_ref.rollout.name={name!r}; valid names: "
            f"{', '.join(ROLLOUT_NAMES)}"
        )
    return _BUILDERS[name]


@register_rollout("hf")
def _hf(
    model: Any,
    tokenizer: Any,
    rollout_config: RolloutConfig,
    model_path: str | None,
    *,
    seed: int = 0,
    model_overrides: dict[str, Any] | None = None,
) -> Any:
    from engine.rollout.hf import HFRollout

    # ``model_overrides`` are already in ``model``'s config: the policy loaded with them.

    return HFRollout(model, tokenizer, rollout_config)


def _served_engine(name: str, engine: str, rollout_class: Callable[[], type]) -> RolloutBuilder:
    """Register the backend ``name``: the class ``rollout_class()`` returns (it imports the
    backend's module when called) over an engine that loads the model from ``model.path``
    itself, so a live module cannot be handed to it."""

    def build(
        model: Any,
        tokenizer: Any,
        rollout_config: RolloutConfig,
        model_path: str | None,
        *,
        seed: int = 0,
        model_overrides: dict[str, Any] | None = None,
    ) -> Any:
        if model_path is None:
            raise ValueError(
                f"actor_rollout_ref.rollout.name={name} loads the model from "
                f"actor_rollout_ref.model.path; set it (a live hf_model cannot be handed to "
                f"{engine})"
            )
        return rollout_class()(
            model_path, tokenizer, rollout_config, seed=seed, model_overrides=model_overrides
        )

    return register_rollout(name)(build)


def _vllm_rollout() -> type:
    from engine.rollout.vllm_rollout import VLLMRollout

    return VLLMRollout


def _sglang_rollout() -> type:
    from engine.rollout.sglang_rollout import SGLangRollout

    return SGLangRollout


_served_engine("vllm", "vLLM", _vllm_rollout)
_served_engine("sglang", "SGLang", _sglang_rollout)
