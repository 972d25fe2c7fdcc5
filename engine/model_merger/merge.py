"""Turn a trainer checkpoint (``global_step_<N>/actor`` or ``/critic``) into a Hugging Face folder.

A checkpoint's ``state.pt`` holds one of two things (see ``engine.trainer.checkpoint``):

- the single-process trainer's full ``state_dict`` under ``"model"`` (a PEFT state dict when the
  policy trains a LoRA adapter);
- a Ray/FSDP2 run's shards: ``{"format": "fsdp2_sharded", "world_size": W, "ranks": [...]}``,
  each rank's ``"model"`` holding its ``Shard(0)`` slice of every parameter (``torch.chunk``
  along dim 0 over the ranks of one shard group; with ``fsdp_size < W`` the groups are
  replicas). The slices of the first shard group, concatenated, are the full tensors.

The architecture and tokenizer come from ``<local_dir>/huggingface`` when the run saved it
(``checkpoint.save_contents`` with ``hf_model``), else from ``--hf_model_path``: the model the
run started from (``actor_rollout_ref.model.path``). The policy is written as a causal LM, the
critic (its ``score`` head) as the one-label token-classification model the trainer builds, and
a LoRA adapter is folded into the base weights, ``W + (alpha / r) B A`` (Hu et al. 2021), so the
folder is a plain model; ``--save-lora-adapter`` also writes the adapter alone with the settings
it trained with (:mod:`engine.model_merger.lora`). Weights keep the dtype they trained in (fp32
master weights).

Every file is read with ``torch.load(weights_only=True)`` (``engine.trainer.checkpoint``), so
merging a checkpoint from elsewhere never runs code from it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.model_merger.errors import MergeError
from engine.model_merger.lora import (
    adapter_config,
    fold_lora,
    full_shape,
    lora_settings,
    write_adapter,
)
from engine.trainer.checkpoint import load_state

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SHARDED_FORMAT = "fsdp2_sharded"


@dataclass
class MergedModel:
    """The merged weights and what is needed to save them as a Hugging Face folder."""

    model: Any  # the plain transformers model holding the full weights (non-persistent buffers
    # such as rotary frequencies stay on the meta device: from_pretrained rebuilds them)
    config: PretrainedConfig
    is_value_model: bool  # the critic: a one-label token-classification model
    source: str  # the folder the config and tokenizer come from
    lora: dict[str, Any] | None  # the adapter's settings, when one was folded in
    adapter: dict[str, torch.Tensor] | None  # PEFT's adapter tensors (names without ".default")
    trust_remote_code: bool = False

    @property
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Return the full weights under the plain model's names."""
        return dict(self.model.state_dict())


# -- reading the checkpoint ----------------------------------------------------------------------


def read_state(local_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """Return ``(state file, its contents)`` for a role folder ``.../global_step_<N>/actor``."""
    local = Path(local_dir)
    state_file = local / "state.pt"
    if not state_file.is_file():
        roles = [r for r in ("actor", "critic") if (local / r / "state.pt").is_file()]
        if roles:
            hint = f"point --local_dir at {local / roles[0]} (one role of the checkpoint)"
        else:
            hint = (
                "point --local_dir at a checkpoint's role folder, "
                "<trainer.default_local_dir>/global_step_<N>/actor (or /critic)"
            )
        raise MergeError(f"{local} is not a checkpoint of this trainer (no {state_file}); {hint}")
    state = load_state(state_file)
    if not isinstance(state, dict):
        raise MergeError(f"{state_file} is not a worker state (a dict); merge actor/ or critic/")
    first = state["ranks"][0] if state.get("ranks") else state
    if "model" in first:
        return state_file, state
    if "contents" not in state:
        raise MergeError(
            f"{state_file} holds no model weights (neither 'model' nor 'ranks'); it was not "
            "written by this trainer's actor or critic"
        )
    raise MergeError(
        f"{state_file} was saved without the weights (checkpoint.save_contents="
        f"{state.get('contents')} has no 'model'); load {local / 'huggingface'} directly "
        "if the run saved hf_model, or merge a checkpoint saved with 'model'"
    )


def check_shards(state_file: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the ranks' states in rank order; MergeError when one is missing or misfits."""
    if state.get("format") != SHARDED_FORMAT:
        raise MergeError(f"{state_file} has format {state.get('format')!r}, not {SHARDED_FORMAT}")
    world_size = int(state.get("world_size") or 0)
    ranks = state.get("ranks") or []
    by_rank: dict[int, dict[str, Any]] = {}
    for index, rank_state in enumerate(ranks):
        rank = rank_state.get("rank", index)
        if rank_state.get("world_size", world_size) != world_size:
            raise MergeError(
                f"{state_file}: rank {rank}'s shard was written by a group of "
                f"{rank_state['world_size']} ranks but the checkpoint says {world_size}; the "
                "file mixes shards of different runs; merge a checkpoint written in one piece "
                "(another global_step_<N>)"
            )
        by_rank[rank] = rank_state
    missing = [r for r in range(world_size) if r not in by_rank]
    if missing or len(ranks) != world_size:
        raise MergeError(
            f"{state_file} should hold the shards of {world_size} ranks but holds ranks "
            f"{sorted(by_rank)}: rank(s) {missing} missing; the checkpoint is incomplete, so "
            "merge another global_step_<N> folder"
        )
    return [by_rank[r] for r in range(world_size)]


def gather_shards(
    state_file: Path, ranks: list[dict[str, Any]], shapes: dict[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """Return the full tensors from the ranks' dim-0 shards (the first shard group's).

    ``shapes`` are the full shapes the model expects. The shard group is the smallest leading
    run of ranks whose slices add up to every full shape: all ranks for plain FSDP, ``fsdp_size``
    of them under HSDP (the later groups hold the same slices).
    """
    names = list(ranks[0]["model"])
    for rank, rank_state in enumerate(ranks):
        if list(rank_state["model"]) != names:
            raise MergeError(
                f"{state_file}: rank {rank}'s shard names other parameters than rank 0's; the "
                "file mixes shards of different models"
            )
    unknown = [n for n in names if list(shapes[n]) == [-1]]
    if unknown:
        raise MergeError(
            f"{state_file} holds parameters the model config does not have ({unknown[:5]}); "
            "check --hf_model_path names the model the run trained"
        )
    for size in range(1, len(ranks) + 1):
        if len(ranks) % size:
            continue
        group = ranks[:size]
        if all(
            sum(r["model"][n].shape[0] for r in group) == shapes[n][0]
            and all(r["model"][n].shape[1:] == shapes[n][1:] for r in group)
            for n in names
        ):
            return {n: torch.cat([r["model"][n] for r in group], dim=0) for n in names}
    misfits = [
        n
        for n in names
        if sum(r["model"][n].shape[0] for r in ranks) != shapes[n][0]
        or ranks[0]["model"][n].shape[1:] != shapes[n][1:]
    ]
    bad = misfits[0] if misfits else names[0]
    raise MergeError(
        f"{state_file}: the shards of {bad!r} ({[tuple(r['model'][bad].shape) for r in ranks]}) "
        f"do not add up to its shape {tuple(shapes[bad])} in the model config; check "
        "--hf_model_path names the model the run trained"
    )


# -- the model config ----------------------------------------------------------------------------


def config_source(local_dir: Path, hf_model_path: str | None) -> str:
    """Return the folder to read the config and tokenizer from (see the module docstring)."""
    saved = local_dir / "huggingface"
    if hf_model_path:
        from engine.roles.model_loading import resolve_path

        path = resolve_path(hf_model_path) or hf_model_path
        if not (Path(path) / "config.json").is_file():
            raise MergeError(
                f"--hf_model_path {hf_model_path!r} is not a Hugging Face model folder (no "
                "config.json); pass the model the run started from (actor_rollout_ref.model.path)"
            )
        return path
    if (saved / "config.json").is_file():
        return str(saved)
    raise MergeError(
        f"{local_dir} has no huggingface/config.json (the run did not save hf_model), so the "
        "architecture is unknown: pass --hf_model_path with the model the run started from "
        "(actor_rollout_ref.model.path, or critic.model.path for a critic; e.g. tiny://model "
        "or a local Hugging Face folder)"
    )


def load_config(source: str, *, trust_remote_code: bool, is_value_model: bool) -> PretrainedConfig:
    """Return the model config, made a one-label token classifier for a value model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    if is_value_model:
        config.num_labels = 1
    return config


def build_skeleton(
    config: PretrainedConfig, *, is_value_model: bool, trust_remote_code: bool
) -> Any:
    """Return the model for ``config`` on the meta device (shapes only, no memory)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if is_value_model else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=trust_remote_code)


# -- the merge -----------------------------------------------------------------------------------


def load_merged_model(
    local_dir: str | Path,
    *,
    hf_model_path: str | None = None,
    trust_remote_code: bool = False,
    tie_word_embedding: bool = False,
    expect_value_model: bool = False,
) -> MergedModel:
    """Return the checkpoint's full weights (shards gathered, adapter folded) with its config.

    A critic is recognised by its ``score`` head; ``expect_value_model`` (verl's
    ``--is-value-model``) makes a checkpoint without one an error.
    """
    local = Path(local_dir)
    state_file, state = read_state(local)
    lora = lora_settings(state, state_file)
    sharded = "ranks" in state
    ranks = check_shards(state_file, state) if sharded else None
    names = list((ranks[0] if ranks else state)["model"])
    is_value_model = any(n == "score.weight" or n.endswith(".score.weight") for n in names)
    if expect_value_model and not is_value_model:
        raise MergeError(
            f"--is-value-model: {state_file} has no value head (score.weight), so it is a "
            "policy; merge it without --is-value-model, or point --local_dir at .../critic"
        )
    source = config_source(local, hf_model_path)
    config = load_config(source, trust_remote_code=trust_remote_code, is_value_model=is_value_model)
    if tie_word_embedding:
        config.tie_word_embeddings = True
    if ranks is not None:
        skeleton = build_skeleton(
            config, is_value_model=is_value_model, trust_remote_code=trust_remote_code
        )
        plain = {k: v.shape for k, v in skeleton.state_dict().items()}
        shapes = {n: full_shape(n, plain, lora) for n in names}
        weights = gather_shards(state_file, ranks, shapes)
    else:
        weights = dict(state["model"])
    adapter = None
    if lora:
        weights, adapter = fold_lora(weights, lora, state_file)
    model = load_checked(weights, config, is_value_model, trust_remote_code, state_file)
    config.dtype = next(iter(weights.values())).dtype
    return MergedModel(model, config, is_value_model, source, lora, adapter, trust_remote_code)


def load_checked(
    weights: dict[str, torch.Tensor],
    config: PretrainedConfig,
    is_value_model: bool,
    trust_remote_code: bool,
    state_file: Path,
) -> Any:
    """Return the model holding ``weights``, once every one of its tensors is there and fits.

    A tied output embedding (``lm_head.weight`` under ``tie_word_embeddings``) may be absent:
    FSDP lists a tied parameter once. An untied model missing a tensor is refused, since
    ``from_pretrained`` would otherwise fill it with random values.
    """
    model = build_skeleton(
        config, is_value_model=is_value_model, trust_remote_code=trust_remote_code
    )
    expected = model.state_dict()
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise MergeError(
            f"{state_file} has tensors the model config does not ({unexpected[:5]}); check "
            "--hf_model_path names the model the run trained"
        )
    wrong = [k for k, v in weights.items() if v.shape != expected[k].shape]
    if wrong:
        k = wrong[0]
        raise MergeError(
            f"{state_file}: {k!r} has shape {tuple(weights[k].shape)} but the model config "
            f"gives {tuple(expected[k].shape)}; check --hf_model_path names the model the run "
            "trained"
        )
    model.load_state_dict(weights, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        output, source = model.get_output_embeddings(), model.get_input_embeddings()
        name = next((k for k in expected if k not in weights), None)
        if output is not None and name is not None:
            output.weight = source.weight
        if output is not None and not torch.equal(output.weight, source.weight):
            raise MergeError(
                f"{state_file}: --tie-word-embedding (or the config's tie_word_embeddings) ties "
                "the output head to the input embeddings, but the checkpoint's two differ; "
                "merge without --tie-word-embedding"
            )
    missing = [k for k, v in model.state_dict().items() if v.is_meta]
    if missing:
        raise MergeError(
            f"{state_file} lacks tensors the model needs ({missing[:5]}); check --hf_model_path "
            "names the model the run trained"
        )
    return model


def save_merged(merged: MergedModel, target_dir: str | Path, *, save_lora_adapter: bool) -> Path:
    """Write the Hugging Face folder (weights, config, generation config, tokenizer), and with
    ``save_lora_adapter`` the adapter alone in ``<target_dir>/lora_adapter``."""
    from transformers import AutoTokenizer, GenerationConfig

    target = Path(target_dir)
    lora_config = None
    if save_lora_adapter:  # checked before anything is written
        if merged.lora is None or merged.adapter is None:
            raise MergeError(
                "--save-lora-adapter: the checkpoint holds no LoRA adapter (lora_rank was 0)"
            )
        skeleton = build_skeleton(
            merged.config, is_value_model=False, trust_remote_code=merged.trust_remote_code
        )
        lora_config = adapter_config(merged.lora, merged.adapter, skeleton)
    model = merged.model
    if not merged.is_value_model:
        # A folder without generation_config.json keeps the one built from the config.
        with contextlib.suppress(OSError):
            model.generation_config = GenerationConfig.from_pretrained(merged.source)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(
        merged.source, trust_remote_code=merged.trust_remote_code
    )
    tokenizer.save_pretrained(target)
    if lora_config is not None and merged.adapter is not None:
        write_adapter(target / "lora_adapter", lora_config, merged.adapter, merged.source)
    return target


def merge_checkpoint(
    local_dir: str | Path,
    target_dir: str | Path,
    *,
    hf_model_path: str | None = None,
    trust_remote_code: bool = False,
    tie_word_embedding: bool = False,
    expect_value_model: bool = False,
    save_lora_adapter: bool = False,
) -> Path:
    """Merge the checkpoint role folder ``local_dir`` into a Hugging Face folder; return it."""
    merged = load_merged_model(
        local_dir,
        hf_model_path=hf_model_path,
        trust_remote_code=trust_remote_code,
        tie_word_embedding=tie_word_embedding,
        expect_value_model=expect_value_model,
    )
    return save_merged(merged, target_dir, save_lora_adapter=save_lora_adapter)


def compare_to_reference(
    local_dir: str | Path,
    test_hf_dir: str | Path,
    *,
    hf_model_path: str | None = None,
    trust_remote_code: bool = False,
    tie_word_embedding: bool = False,
    expect_value_model: bool = False,
    atol: float = 1e-6,
) -> dict[str, Any]:
    """Return a summary once the checkpoint's merged weights equal the folder's; MergeError
    naming the first difference otherwise (verl's ``model_merger test``)."""
    from safetensors.torch import load_file

    merged = load_merged_model(
        local_dir,
        hf_model_path=hf_model_path,
        trust_remote_code=trust_remote_code,
        tie_word_embedding=tie_word_embedding,
        expect_value_model=expect_value_model,
    )
    files = sorted(Path(test_hf_dir).glob("*.safetensors"))
    if not files:
        raise MergeError(f"--test_hf_dir {test_hf_dir} has no *.safetensors weights")
    reference: dict[str, torch.Tensor] = {}
    for file in files:
        reference.update(load_file(str(file)))
    ours = merged.state_dict
    for name in sorted(set(ours) - set(reference)):
        if not _is_tied_copy(name, ours, reference):
            raise MergeError(f"{test_hf_dir} lacks {name!r}, which the checkpoint has")
    extra = sorted(set(reference) - set(ours))
    if extra:
        raise MergeError(f"{test_hf_dir} has tensors the checkpoint lacks ({extra[:5]})")
    worst = 0.0
    for name, tensor in reference.items():
        mine = ours[name]
        if mine.shape != tensor.shape or mine.dtype != tensor.dtype:
            raise MergeError(
                f"{name!r}: the checkpoint gives {tuple(mine.shape)} {mine.dtype}, {test_hf_dir} "
                f"{tuple(tensor.shape)} {tensor.dtype}"
            )
        diff = (mine.double() - tensor.double()).abs().max().item() if mine.numel() else 0.0
        if diff > atol:
            raise MergeError(f"{name!r} differs from {test_hf_dir} by up to {diff:.3g} (> {atol})")
        worst = max(worst, diff)
    return {"tensors": len(reference), "max_abs_diff": worst}


def _is_tied_copy(name: str, ours: dict[str, torch.Tensor], reference: Any) -> bool:
    # save_pretrained drops a tied output head: it shares its tensor with one that is kept.
    pointer = ours[name].data_ptr()
    return any(ours[k].data_ptr() == pointer for k in reference if k in ours and k != name)
