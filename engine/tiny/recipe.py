"""The recipe for the embedded tiny model: architecture, supervised warm start and on-disk cache.

The model is a randomly initialised ``Qwen2ForCausalLM`` of about one million parameters, so the
same code paths that load Qwen2.5-0.5B on a GPU run here on a CPU in seconds. A random model
never answers, which leaves RL with no reward to learn from, so the recipe first runs a short
supervised pass on the arithmetic task and stops it early, at the first check whose greedy
validation accuracy lies in ``SftSettings.accuracy_window`` (about 40%): good enough that
rollouts earn reward, poor enough that RL has clear room to improve.

Learning addition shows a sudden transition (greedy accuracy sits near 5-10% for a few hundred
steps, then jumps past 60% within a few dozen), so accuracy is checked rarely while it is low and
every few steps once it starts rising; the first check at or above the window's lower edge ends
the pass, and the checkpoint closest to the target is kept. When the transition comes depends on
the seed and on the CPU: AVX2 and AVX-512 kernels round differently, and a few hundred steps of
training turn that into a different run. Without weight decay the recipe's seed reached the
window at step 370 on one machine and not at all within 600 steps on another; with weight decay
0.1 seeds 0, 1 and 2 reached it at steps 440, 480 and 360 (on an AVX2 machine), and ``max_steps``
leaves about twice that as margin.

Everything is deterministic on one thread: seeded initialisation and data order, one torch
thread, greedy checks. Assets live in ``<data_dir>/tiny/<recipe_hash>/``; the hash covers these
settings and the source text of this package (and of the reward that scores the checks), so the
cache is rebuilt exactly when the recipe changes. A build writes into a temporary folder under a
file lock and renames it into place, so concurrent callers never see half a build.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

import engine.rewards.arithmetic as arithmetic_reward
from engine import env
from engine.tiny.cache import MANIFEST_NAME, build_once
from engine.tiny.task import Problem, make_problems, split_pool, write_split
from engine.tiny.tokenizer import build_tokenizer

PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SftSettings:
    """Settings of the supervised warm start (AdamW on the train split, stopped early)."""

    batch_size: int = 64
    learning_rate: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1  # brings the transition earlier and more reliably
    warmup_steps: int = 100
    grad_clip: float = 1.0
    max_steps: int = 1000
    sparse_check_every: int = 20  # while accuracy is below ``dense_from``
    dense_check_every: int = 5  # once it is rising
    dense_from: float = 0.12
    accuracy_window: tuple[float, float] = (0.30, 0.45)
    target_accuracy: float = 0.40
    max_new_tokens: int = 4  # up to three digits and <eos>


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of the Qwen2 model; the defaults give the embedded tiny model (~1M parameters)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 256


TINY_SHAPE = ModelShape()


@dataclass(frozen=True)
class TinyRecipe:
    """Every constant that determines the embedded assets; it is hashed into the cache key."""

    seed: int = 0
    train_rows: int = 2000
    val_rows: int = 200
    model: ModelShape = TINY_SHAPE
    sft: SftSettings = field(default_factory=SftSettings)


RECIPE = TinyRecipe()


@dataclass(frozen=True)
class TinyAssets:
    """Paths of one built recipe and its manifest (parameter count, accuracy, timings)."""

    root: Path
    model_dir: Path
    train_parquet: Path
    val_parquet: Path
    train_jsonl: Path
    val_jsonl: Path
    manifest: dict[str, Any]


@dataclass(frozen=True)
class WarmStartResult:
    """Outcome of the supervised pass: steps taken, accuracy kept, and every check made."""

    steps: int
    accuracy: float
    history: list[tuple[int, float]]


def build_model(
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    *,
    hidden_size: int = TINY_SHAPE.hidden_size,
    num_layers: int = TINY_SHAPE.num_layers,
    num_heads: int = TINY_SHAPE.num_heads,
    num_kv_heads: int = TINY_SHAPE.num_kv_heads,
    intermediate_size: int = TINY_SHAPE.intermediate_size,
    max_positions: int = TINY_SHAPE.max_positions,
) -> Qwen2ForCausalLM:
    """Return a randomly initialised fp32 Qwen2 causal LM sized for the tokenizer (tied embeddings)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = plain_sampling(tokenizer)
    return model


def plain_sampling(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Return a generation config that samples from the full policy (top_k=0) by default.

    transformers would otherwise cut sampling to the 50 likeliest tokens, and PPO's
    log-probabilities would not match the rollout's. Greedy callers pass do_sample=False.
    """
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Return the number of distinct parameters (tied embeddings counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())


def chat_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """Return the question rendered as a one-turn chat ending with the assistant role token."""
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return cast(str, text)


def encode_sft_batch(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``input_ids, attention_mask, labels``, each ``(bs, seq_len)``, right-padded.

    Labels are -100 everywhere except on the answer tokens and the closing ``<eos>``. Right
    padding keeps every sequence's positions starting at 0, as generation computes them.
    """
    prompts = [chat_prompt(tokenizer, problem.question) for problem in problems]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer([p.answer for p in problems], add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id]
    pairs = list(zip(prompt_ids, answer_ids, strict=True))
    sequences = [prompt + answer + eos for prompt, answer in pairs]
    labels = [[-100] * len(prompt) + answer + eos for prompt, answer in pairs]
    seq_len = max(len(sequence) for sequence in sequences)
    pad = [tokenizer.pad_token_id]
    input_ids = torch.tensor([s + pad * (seq_len - len(s)) for s in sequences])  # (bs, seq_len)
    attention_mask = torch.tensor([[1] * len(s) + [0] * (seq_len - len(s)) for s in sequences])
    label_ids = torch.tensor([t + [-100] * (seq_len - len(t)) for t in labels])  # (bs, seq_len)
    return input_ids, attention_mask, label_ids


@torch.no_grad()
def greedy_responses(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    max_new_tokens: int = 4,
) -> list[str]:
    """Return the greedy reply to each question (one left-padded batch, KV cache, no specials)."""
    was_training = model.training
    model.eval()
    batch = tokenizer(
        [chat_prompt(tokenizer, question) for question in questions],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )  # input_ids, attention_mask: (n, prompt_len)
    # transformers' generate is typed with an explicit self under torch.no_grad, which mypy
    # binds twice.
    output = model.generate(  # type: ignore[misc]
        **batch, do_sample=False, max_new_tokens=max_new_tokens, use_cache=True
    )  # (n, prompt_len + new_len)
    model.train(was_training)
    new_tokens = output[:, batch["input_ids"].shape[1] :]  # (n, new_len)
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


def greedy_accuracy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    answers: list[str],
    max_new_tokens: int = 4,
) -> float:
    """Return the mean arithmetic reward of the greedy replies against the answers."""
    if len(questions) != len(answers) or not questions:
        raise ValueError(
            f"greedy_accuracy needs as many answers as questions, at least one: got "
            f"{len(questions)} questions and {len(answers)} answers"
        )
    responses = greedy_responses(model, tokenizer, questions, max_new_tokens)
    scores = [
        arithmetic_reward.compute_score(r, a) for r, a in zip(responses, answers, strict=True)
    ]
    return sum(scores) / len(scores)


def _index_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[list[int]]:
    """Yield batches of indices into ``range(n)`` forever, reshuffled each epoch (no partials)."""
    while True:
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    train: list[Problem],
    val: list[Problem],
    settings: SftSettings,
    seed: int,
) -> WarmStartResult:
    """Train on answer tokens until greedy val accuracy reaches the window; keep the best state.

    The model is left holding the kept weights: those of the first check inside the window,
    else of the check closest to ``settings.target_accuracy``.
    """
    if len(train) < settings.batch_size:
        raise ValueError(
            f"warm_start needs at least batch_size={settings.batch_size} train problems, "
            f"got {len(train)}; pass more problems or lower SftSettings.batch_size"
        )
    low = settings.accuracy_window[0]
    questions = [problem.question for problem in val]
    answers = [problem.answer for problem in val]
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=settings.learning_rate,
        betas=settings.betas,
        weight_decay=settings.weight_decay,
    )
    batches = _index_batches(len(train), settings.batch_size, torch.Generator().manual_seed(seed))
    history: list[tuple[int, float]] = []
    best: tuple[float, int, float, dict[str, torch.Tensor]] | None = None
    accuracy = 0.0
    model.train()
    for step in range(1, settings.max_steps + 1):
        batch = [train[index] for index in next(batches)]
        input_ids, attention_mask, labels = encode_sft_batch(tokenizer, batch)  # (bs, seq_len)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = settings.learning_rate * min(1.0, step / settings.warmup_steps)
        optimizer.step()
        rising = accuracy >= settings.dense_from
        every = settings.dense_check_every if rising else settings.sparse_check_every
        if step % every and step < settings.max_steps:
            continue
        accuracy = greedy_accuracy(model, tokenizer, questions, answers, settings.max_new_tokens)
        history.append((step, accuracy))
        distance = abs(accuracy - settings.target_accuracy)
        if best is None or distance < best[0]:
            best = (distance, step, accuracy, copy.deepcopy(model.state_dict()))
        if accuracy >= low:
            break
    assert best is not None  # the last step always runs a check
    _, kept_step, kept_accuracy, state = best
    model.load_state_dict(state)
    model.eval()
    return WarmStartResult(steps=kept_step, accuracy=kept_accuracy, history=history)


def recipe_hash(recipe: TinyRecipe = RECIPE) -> str:
    """Return a short hash of the recipe's settings and the source of the code that builds it."""
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    sources = sorted(PACKAGE_DIR.glob("*.py")) + [Path(arithmetic_reward.__file__)]
    for source in sources:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def build_assets(out_dir: Path, recipe: TinyRecipe = RECIPE) -> dict[str, Any]:
    """Build the tokenizer, model, warm start and data into ``out_dir``; return the manifest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reproducible sums, and no fight over a shared CPU
    try:
        return _build_assets(out_dir, recipe)
    finally:
        torch.set_num_threads(threads)


def _build_assets(out_dir: Path, recipe: TinyRecipe) -> dict[str, Any]:
    """Build the assets on the current torch thread setting; see ``build_assets``."""
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, recipe.seed, **asdict(recipe.model))
    train = make_problems("train", recipe.train_rows, recipe.seed)
    val = make_problems("val", recipe.val_rows, recipe.seed)
    # The warm start sees the whole train split: more distinct pairs generalise better than
    # epochs over the RL rows, and no validation pair is among them.
    sft_started = time.perf_counter()
    result = warm_start(model, tokenizer, split_pool("train"), val, recipe.sft, recipe.seed)
    sft_seconds = time.perf_counter() - sft_started
    model_dir = out_dir / "model"
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    write_split(train, "train", out_dir / "data")
    write_split(val, "val", out_dir / "data")
    manifest = {
        "recipe_hash": recipe_hash(recipe),
        "recipe": asdict(recipe),
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "sft_steps": result.steps,
        "val_accuracy": result.accuracy,
        "accuracy_checks": [list(check) for check in result.history],
        "sft_seconds": round(sft_seconds, 2),
        "build_seconds": round(time.perf_counter() - started, 2),
        "torch_num_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _assets_at(root: Path) -> TinyAssets:
    """Return the asset paths under a built recipe folder."""
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    return TinyAssets(
        root=root,
        model_dir=root / "model",
        train_parquet=root / "data" / "train.parquet",
        val_parquet=root / "data" / "val.parquet",
        train_jsonl=root / "data" / "train.jsonl",
        val_jsonl=root / "data" / "val.jsonl",
        manifest=manifest,
    )


def ensure_tiny_assets(
    data_dir: Path | None = None, force: bool = False, recipe: TinyRecipe = RECIPE
) -> TinyAssets:
    """Return the built assets under ``<data_dir>/tiny/<recipe_hash>/``, building them if needed.

    ``data_dir`` defaults to ``engine.env.data_dir()``; ``force`` rebuilds even when cached;
    another ``recipe`` (a larger model, say) gets a folder of its own.
    """
    base = Path(data_dir if data_dir is not None else env.data_dir()) / "tiny"
    root = build_once(
        base, recipe_hash(recipe), lambda staging: build_assets(staging, recipe), force=force
    )
    return _assets_at(root)
