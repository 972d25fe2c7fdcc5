"""The recipe for the embedded tiny reward model: a one-label Qwen2 classifier of arithmetic answers.

The model is a ``Qwen2ForSequenceClassification`` with the tiny policy's shape and tokenizer: it
reads ``<bos><|user|>12+35=<|assistant|>47<eos>`` (the tokenizer's chat template over the question
and a reply, as ``RewardModelScorer`` renders it) and its one logit, read at the last token, is
the score. It is trained from scratch with a binary cross-entropy on balanced batches: each train
problem once with its answer (label 1) and once with a wrong reply (label 0), so a correct answer
scores above 0 and a wrong one below.

The wrong replies imitate what a policy learning addition gets wrong: near misses (off by 1, 2,
10, 11, ...; the carry errors), one digit replaced, two digits swapped, a digit dropped or added,
a random number, and junk around the answer (``"47="``, ``"4 7"``). A classifier that only saw
random numbers would tell them apart by length and leave RL nothing to learn from once the
policy's answers look plausible. Training also predicts the answer tokens of correct replies
with the tied embeddings as output layer (a language-model loss beside the classifier's): to
verify a sum the network has to work it out, and this loss asks it to directly. The learning rate
warms up, then follows a cosine to zero.

Measured on a shared 2-core machine (one torch thread, constant learning rate, before the cosine
was added): held-out pairwise accuracy 0.80 after 100 steps, 0.88 after 200, 0.91 after 300 and
0.92 after 400. The recipe trains 1600 steps: AVX2 and AVX-512 kernels round differently, and
after 700 steps the ranking of an answer above its off-by-one or off-by-ten twin was 0.905 on one
CPU and 0.78 on another; on the latter, 1200 steps gave 0.895 and 1600 gave 1.0 (200 held-out
problems, 2026-12-05). Starting from the tiny policy's weights instead (as InstructGPT's reward
model starts from the SFT model) was slower here, 0.74 after 100 steps, and would tie this cache to
the policy's.

The cache works like the tiny policy's (``engine.tiny.recipe``): the folder is keyed by a hash of
these settings and of the source of this module, the task and the tokenizer, built once under a
file lock into a temporary folder and renamed into place. ``tiny://reward_model`` names it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForSequenceClassification

import engine.tiny.task as task_module
import engine.tiny.tokenizer as tokenizer_module
from engine import env
from engine.tiny.cache import MANIFEST_NAME, build_once
from engine.tiny.recipe import TINY_SHAPE, ModelShape, count_parameters
from engine.tiny.task import Problem, split_pool
from engine.tiny.tokenizer import build_tokenizer

CACHE_DIR = "tiny_reward_model"
DIGITS = "0123456789"
JUNK = "=+ x-"
# How often each kind of wrong reply is drawn (in wrong_answer's order): near misses, then a
# replaced digit, are the mistakes a policy learning addition makes most and the hardest to spot.
WRONG_KIND_WEIGHTS = (4, 2, 1, 1, 1, 1, 1)


@dataclass(frozen=True)
class RewardTrainSettings:
    """Settings of the classifier's training (AdamW on the train split's problems)."""

    batch_size: int = 64  # problems per step; each appears once right and once wrong
    learning_rate: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 50
    grad_clip: float = 1.0
    steps: int = 1600
    lm_loss_weight: float = 1.0  # the auxiliary answer-prediction loss


@dataclass(frozen=True)
class RewardModelRecipe:
    """Every constant that determines the embedded reward model; it is hashed into the cache key."""

    seed: int = 0
    model: ModelShape = TINY_SHAPE
    train: RewardTrainSettings = field(default_factory=RewardTrainSettings)
    eval_problems: int = 300  # held-out (validation split) problems for the manifest's accuracy


REWARD_MODEL_RECIPE = RewardModelRecipe()


def wrong_answer(problem: Problem, rng: random.Random) -> str:
    """Return a reply to ``problem`` that is not its answer, in one of the ways a policy errs."""
    answer, total = problem.answer, problem.a + problem.b
    while True:
        kind = rng.choices(range(len(WRONG_KIND_WEIGHTS)), weights=WRONG_KIND_WEIGHTS)[0]
        if kind == 0:  # a near miss: off by one, a few, or a carry
            delta = rng.choice([1, 2, 3, 9, 10, 11, 20, 100]) * rng.choice([-1, 1])
            reply = str(total + delta) if total + delta >= 0 else ""
        elif kind == 1:  # one digit replaced
            i = rng.randrange(len(answer))
            reply = answer[:i] + rng.choice(DIGITS.replace(answer[i], "")) + answer[i + 1 :]
        elif kind == 2 and len(answer) > 1:  # two neighbouring digits swapped
            i = rng.randrange(len(answer) - 1)
            reply = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
        elif kind == 3:  # a digit dropped or added
            i = rng.randrange(len(answer) + 1)
            drop = len(answer) > 1 and rng.random() < 0.5
            insert = "" if drop else rng.choice(DIGITS)
            reply = answer[:i] + insert + answer[i + (1 if drop else 0) :]
        elif kind == 4:  # any number
            reply = str(rng.randrange(199))
        elif kind == 5:  # junk around or inside the answer
            i = rng.randrange(len(answer) + 1)
            reply = answer[:i] + rng.choice(JUNK) + answer[i:]
        else:  # the question's operands instead of the sum
            reply = rng.choice([str(problem.a), str(problem.b), f"{problem.a}{problem.b}"])
        if reply and reply != answer and not (reply.isdigit() and int(reply) == total):
            return reply


def build_classifier(
    tokenizer: PreTrainedTokenizerBase, seed: int, shape: ModelShape = TINY_SHAPE
) -> Qwen2ForSequenceClassification:
    """Return a randomly initialised one-label fp32 Qwen2 sequence classifier (tied embeddings)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    config.num_labels = 1  # a property: Qwen2Config's signature does not name it
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(config)


def reply_text(tokenizer: PreTrainedTokenizerBase, question: str, reply: str) -> str:
    """Return the text scored for (question, reply): the chat template over both turns."""
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    return str(tokenizer.apply_chat_template(messages, tokenize=False))


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase, questions: list[str], replies: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``input_ids, attention_mask``, each ``(n, seq_len)``, right-padded."""
    texts = [reply_text(tokenizer, q, r) for q, r in zip(questions, replies, strict=True)]
    enc = tokenizer(
        texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt"
    )
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def score_replies(
    model: Qwen2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    replies: list[str],
) -> torch.Tensor:
    """Return the classifier's score of each (question, reply), shape ``(n,)``."""
    was_training = model.training
    model.eval()
    input_ids, attention_mask = encode_pairs(tokenizer, questions, replies)  # (n, seq_len)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (n, 1)
    model.train(was_training)
    return logits[:, 0]


def pairwise_accuracy(
    model: Qwen2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    seed: int,
    wrong_per_problem: int = 3,
) -> float:
    """Return how often the answer scores above a wrong reply to the same problem."""
    rng = random.Random(seed)
    questions = [p.question for p in problems]
    right = score_replies(model, tokenizer, questions, [p.answer for p in problems])  # (n,)
    wins = []
    for _ in range(wrong_per_problem):
        wrong = [wrong_answer(p, rng) for p in problems]
        wins.append(right > score_replies(model, tokenizer, questions, wrong))  # (n,)
    return torch.cat(wins).float().mean().item()


def _training_batch(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem], rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``input_ids, attention_mask, lm_labels`` ``(2B, L)`` and ``labels`` ``(2B,)``.

    The first B rows carry the answers (LM labels on the answer tokens and ``<eos>``), the next B
    a wrong reply each (no LM labels).
    """
    questions = [p.question for p in problems] * 2
    replies = [p.answer for p in problems] + [wrong_answer(p, rng) for p in problems]
    input_ids, attention_mask = encode_pairs(tokenizer, questions, replies)  # (2B, L)
    lm_labels = torch.full_like(input_ids, -100)  # (2B, L)
    for row, problem in enumerate(problems):
        n_answer = len(tokenizer(problem.answer, add_special_tokens=False)["input_ids"]) + 1
        end = int(attention_mask[row].sum())
        lm_labels[row, end - n_answer : end] = input_ids[row, end - n_answer : end]
    labels = torch.cat([torch.ones(len(problems)), torch.zeros(len(problems))])  # (2B,)
    return input_ids, attention_mask, lm_labels, labels


def train_classifier(
    model: Qwen2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    train: list[Problem],
    settings: RewardTrainSettings,
    seed: int,
) -> list[float]:
    """Train the classifier in place; return the loss of every step."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=settings.learning_rate,
        betas=settings.betas,
        weight_decay=settings.weight_decay,
    )
    rng = random.Random(seed)
    embedding = model.model.embed_tokens.weight  # (vocab, hidden): the tied output layer
    losses = []
    model.train()
    for step in range(1, settings.steps + 1):
        batch = rng.sample(train, settings.batch_size)
        input_ids, attention_mask, lm_labels, labels = _training_batch(tokenizer, batch, rng)
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(-1) - 1  # (2B,): the <eos> of each right-padded row
        logits = model.score(hidden[torch.arange(len(last)), last])[:, 0]  # (2B,)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        if settings.lm_loss_weight:
            lm_logits = hidden[:, :-1] @ embedding.T  # (2B, L - 1, vocab)
            lm_loss = torch.nn.functional.cross_entropy(
                lm_logits.reshape(-1, lm_logits.shape[-1]), lm_labels[:, 1:].reshape(-1)
            )
            loss = loss + settings.lm_loss_weight * lm_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        warmup = min(1.0, step / settings.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * (step - 1) / settings.steps))
        for group in optimizer.param_groups:
            group["lr"] = settings.learning_rate * warmup * cosine
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def reward_model_hash(recipe: RewardModelRecipe = REWARD_MODEL_RECIPE) -> str:
    """Return a short hash of the recipe's settings and the source of the code that builds it."""
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    for source in (Path(__file__), Path(task_module.__file__), Path(tokenizer_module.__file__)):
        digest.update(source.name.encode())
        digest.update(Path(source).resolve().read_bytes())
    return digest.hexdigest()[:16]


def build_reward_model(
    out_dir: Path, recipe: RewardModelRecipe = REWARD_MODEL_RECIPE
) -> dict[str, Any]:
    """Train the classifier on one torch thread and save it to ``out_dir``; return the manifest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible sums, and no fight over a shared CPU
    try:
        started = time.perf_counter()
        tokenizer = build_tokenizer()
        model = build_classifier(tokenizer, recipe.seed, recipe.model)
        losses = train_classifier(model, tokenizer, split_pool("train"), recipe.train, recipe.seed)
        held_out = random.Random(recipe.seed).sample(split_pool("val"), recipe.eval_problems)
        accuracy = pairwise_accuracy(model, tokenizer, held_out, recipe.seed)
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        manifest = {
            "recipe_hash": reward_model_hash(recipe),
            "recipe": asdict(recipe),
            "parameters": count_parameters(model),
            "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
            "val_pairwise_accuracy": accuracy,
            "build_seconds": round(time.perf_counter() - started, 2),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
    finally:
        torch.set_num_threads(threads)
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def ensure_tiny_reward_model(
    data_dir: Path | None = None,
    force: bool = False,
    recipe: RewardModelRecipe = REWARD_MODEL_RECIPE,
) -> Path:
    """Return the folder of the built reward model under ``<data_dir>/tiny_reward_model/<hash>/``."""
    base = Path(data_dir if data_dir is not None else env.data_dir()) / CACHE_DIR
    return build_once(
        base,
        reward_model_hash(recipe),
        lambda staging: build_reward_model(staging, recipe),
        force=force,
    )
