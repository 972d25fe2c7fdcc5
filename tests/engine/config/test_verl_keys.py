"""Every key of verl 0.7's config and of verl main's is in the schema, in exactly one of three
tables, and does what its table says: honoured keys are read, no-effect keys warn in one line,
refused keys fail; the keys main moved are read under both spellings."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.config import get_value, iter_field_specs
from engine.config.fields import EFFECTS, HONOURED, NO_EFFECT, REFUSED, ConfigValidationError
from engine.config.loader import config_from_dict, load_config, load_raw
from engine.config.resolve import resolve_config
from engine.config.tables import stale_files
from engine.config.validate import validate_config
from engine.config.versions import ADDED_IN_MAIN, NOT_IN_VERL, REMOVED_IN_MAIN, verl_releases

VERL_FILE = Path(__file__).parent / "data" / "verl_0_7_ppo_trainer.yaml"
# verl's main branch, 0.8.0.dev (commit b178a3cd5, January 2026).
VERL_MAIN_FILE = Path(__file__).parent / "data" / "verl_main_ppo_trainer.yaml"
VERL_FILES = {"0.7": (VERL_FILE, 537), "main": (VERL_MAIN_FILE, 556)}
REPO = Path(__file__).resolve().parents[3]
SPECS = {spec.key: spec for spec in iter_field_specs()}
# What verl leaves to be given (???).
VERL_FILE_OVERRIDES = [
    "actor_rollout_ref.rollout.name=hf",
]


def verl_leaves(path: Path = VERL_FILE) -> list[str]:
    def walk(tree: Any, prefix: str):
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield prefix + key

    return list(walk(yaml.safe_load(path.read_text()), ""))


def covered(key: str) -> bool:
    """Return whether ``key`` is a schema key or section, or lies inside a key holding a mapping."""
    parts = key.split(".")
    if any(other.startswith(key + ".") for other in SPECS):  # a whole section, as a reference
        return True
    return any(
        ".".join(parts[:n]) in SPECS
        and (n == len(parts) or SPECS[".".join(parts[:n])].type is dict)
        for n in range(1, len(parts) + 1)
    )


@pytest.mark.parametrize("release", VERL_FILES)
def test_every_key_of_verls_generated_config_is_in_the_schema(release):
    path, count = VERL_FILES[release]
    leaves = verl_leaves(path)
    assert len(leaves) == count
    assert [key for key in leaves if not covered(key)] == []
    assert sum(key.endswith("._target_") or key == "_target_" for key in leaves) > 30


def _in(key: str, leaves: list[str]) -> bool:
    return key in leaves or any(
        leaf.startswith(key + ".") or key.startswith(leaf + ".") for leaf in leaves
    )


def test_the_verl_column_says_which_release_has_each_key():
    old, main = verl_leaves(VERL_FILE), verl_leaves(VERL_MAIN_FILE)
    expected = {
        (True, True): "0.7, main",
        (False, True): "added in main (0.8.0.dev)",
        (True, False): "0.7; removed in main (0.8.0.dev)",
        (False, False): "-",
    }
    wrong = {
        key: verl_releases(key)
        for key in SPECS
        if verl_releases(key) != expected[_in(key, old), _in(key, main)]
    }
    assert wrong == {}
    doc = (REPO / "docs" / "config.md").read_text()
    assert "| `actor_rollout_ref.actor.use_prefix_grouper` | `false` | added in main" in doc
    for entry in (*ADDED_IN_MAIN, *REMOVED_IN_MAIN, *NOT_IN_VERL):  # no stale entry
        assert any(key == entry or key.startswith(entry + ".") for key in SPECS), entry


@pytest.mark.parametrize("release", VERL_FILES)
def test_verls_own_file_loads_unchanged_and_validates(release):
    cfg = load_config(str(VERL_FILES[release][0]), VERL_FILE_OVERRIDES)
    # verl's example file points the (off) reward model at a folder, which reward_model.enable
    # would read: no longer a key without effect.
    warnings = validate_config(cfg, check_files=False)
    assert not any("reward_model" in w for w in warnings), warnings
    deprecated = [w for w in warnings if w.startswith("[DEPRECATED]")]
    # 0.7's file writes the bucket size under the key main moved: one note, the value kept.
    assert len(deprecated) == (1 if release == "0.7" else 0), deprecated
    resolved_bucket = resolve_config(cfg).actor_rollout_ref.rollout.checkpoint_engine
    assert resolved_bucket.update_weights_bucket_megabytes == (512 if release == "0.7" else 2048)
    max_num_seqs = cfg.actor_rollout_ref.rollout.max_num_seqs
    assert max_num_seqs == (1024 if release == "0.7" else 256)
    assert cfg.reward_model.model.path == "~/models/FsfairX-LLaMA3-RM-v0.1"
    resolved = resolve_config(cfg)
    arr = resolved.actor_rollout_ref
    assert arr.actor.rollout_n == arr.rollout.n  # ${oc.select:actor_rollout_ref.rollout.n,1}
    assert resolved.critic.forward_max_token_len_per_gpu == 32768  # ${.ppo_max_token_len_per_gpu}
    assert arr.actor.checkpoint.load_contents == arr.actor.checkpoint.save_contents
    assert arr.rollout.profiler.tool_config == arr.actor.profiler.tool_config  # a whole section


def test_verls_file_says_what_it_leaves_to_be_given():
    with pytest.raises(ValueError, match=r"rollout.name='\?\?\?'.*leaves this key to be given"):
        load_config(str(VERL_FILE))


def test_verls_file_switches_on_the_padding_free_forward_for_policy_and_critic():
    # use_remove_padding was its one refused feature; now the workers read it
    # (tests/engine/roles/test_remove_padding.py).
    cfg = resolve_config(load_config(str(VERL_FILE), VERL_FILE_OVERRIDES))
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert cfg.actor_rollout_ref.actor.use_remove_padding is True  # ${oc.select:...model...}
    assert cfg.critic.model.use_remove_padding is False


def test_every_key_is_in_exactly_one_table_and_refused_keys_say_why():
    assert {spec.effect for spec in SPECS.values()} <= set(EFFECTS)
    for spec in SPECS.values():
        assert bool(spec.why) == (spec.effect == REFUSED), spec.key
    doc = (REPO / "docs" / "config.md").read_text()
    for key in SPECS:
        assert doc.count(f"| `{key}` |") == 1, key


# Words of keys that change what a run computes: none of them may sit in "no effect".
MEANING = re.compile(
    r"(^algorithm\.|^reward\.|policy_loss\.|\.lr$|clip|kl|loss|temperature|top_[pk]|\.n$|"
    r"^data\.(max_|train_batch|prompt_key|truncation|shuffle|seed)|mini_batch|epochs|"
    r"entropy_coeff|gamma|lam$|total_|save_freq|test_freq|resume|reward_fn_key|\.enable$)"
)


def test_no_key_that_changes_a_run_sits_in_no_effect():
    inert = [k for k, s in SPECS.items() if s.effect == NO_EFFECT and MEANING.search(k)]
    allowed = {
        # Profilers and servers that this engine does not start, whatever they are told.
        *(k for k in inert if ".profiler." in k or "global_profiler" in k or "prometheus" in k),
        # verl's reward-model servers and FSDP role: the reward model scores in the trainer.
        *(k for k in inert if k.startswith("reward_model.")),
    }
    assert sorted(set(inert) - allowed) == []


def test_generated_files_are_fresh():
    assert stale_files() == [], "run python -m engine.config.tables --write"


def _other_value(spec, current: Any) -> Any:
    """Return a value of the key's type that differs from ``current``."""
    if spec.choices and spec.type is not list:
        return next(c for c in spec.choices if c != current)
    if spec.type is bool:
        return not bool(current)
    if spec.type is int:
        return (current or 0) + 2
    if spec.type is float:
        return (current or 0.0) + 0.5
    if spec.type is list:
        item = spec.choices[0] if spec.choices else (1 if spec.item_type is int else "x")
        return [*(current or []), item]
    if spec.type is dict:  # data that every mapping's rule accepts (a model config attribute)
        return {"attention_dropout": 0.1}
    return "something-else"


@functools.cache
def _tiny_tree() -> dict:
    return load_raw("grpo_tiny")


@functools.cache
def _tiny_resolved():
    return resolve_config(config_from_dict(_tiny_tree()))


def _tree_with(key: str, value: Any) -> dict:
    tree = copy.deepcopy(_tiny_tree())
    node = tree
    *sections, leaf = key.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    node[leaf] = value
    return tree


@pytest.mark.parametrize("key", [k for k, s in SPECS.items() if s.effect == REFUSED])
def test_a_refused_key_set_off_its_default_is_an_error_that_says_what_to_do(key):
    spec = SPECS[key]
    current = _tiny_resolved()
    value = _other_value(spec, get_value(current, spec.follows) if spec.follows else spec.default)
    cfg = config_from_dict(_tree_with(key, value))
    with pytest.raises(ConfigValidationError) as caught:
        validate_config(cfg, check_files=False)
    errors = {e.key: e.message for e in caught.value.errors}
    assert key in errors, errors
    assert errors[key] == f"not supported here: {spec.why}"


@pytest.mark.parametrize(
    "key", [k for k, s in SPECS.items() if s.effect == NO_EFFECT and not s.follows]
)
def test_a_no_effect_key_set_is_named_in_one_warning_line(key):
    spec = SPECS[key]
    cfg = config_from_dict(_tree_with(key, _other_value(spec, spec.default)))
    warnings = validate_config(cfg, check_files=False)
    lines = [w for w in warnings if w.startswith("no effect here")]
    assert len(lines) == 1 and f"{key}=" in lines[0], warnings


def test_two_no_effect_keys_share_one_warning_line():
    cfg = load_config(
        "grpo_tiny",
        ["actor_rollout_ref.model.use_shm=True", "actor_rollout_ref.rollout.layered_summon=True"],
    )
    warnings = [w for w in validate_config(cfg, check_files=False) if "no effect" in w]
    assert len(warnings) == 1
    assert "actor_rollout_ref.model.use_shm=True" in warnings[0]
    assert "actor_rollout_ref.rollout.layered_summon=True" in warnings[0]


def test_a_derived_key_must_equal_the_key_it_follows():
    ok = load_config("grpo_tiny", ["actor_rollout_ref.actor.rollout_n=8"])  # rollout.n is 8
    assert ok.actor_rollout_ref.rollout.n == 8
    validate_config(ok, check_files=False)
    bad = load_config("grpo_tiny", ["actor_rollout_ref.actor.rollout_n=3"])
    with pytest.raises(ConfigValidationError, match="derived from actor_rollout_ref.rollout.n"):
        validate_config(bad, check_files=False)


def test_verls_legacy_global_micro_batch_sizes_are_divided_by_the_data_parallel_size():
    cfg = load_config(
        "grpo_tiny",
        [
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size=16",
        ],
    )
    warnings = validate_config(cfg, check_files=False)
    deprecated = [w for w in warnings if w.startswith("[DEPRECATED]")]
    assert len(deprecated) == 2
    assert "ppo_micro_batch_size_per_gpu=4" in deprecated[0]
    arr = resolve_config(cfg).actor_rollout_ref
    assert arr.actor.ppo_micro_batch_size_per_gpu == 4
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [
                "actor_rollout_ref.actor.ppo_micro_batch_size=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            ],
            "set both",
        ),
        (
            ["trainer.n_gpus_per_node=3", "actor_rollout_ref.actor.ppo_micro_batch_size=8"],
            "cannot share",
        ),
        (
            ["actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.optim.clip_grad=2"],
            "name one setting",
        ),
        (["ray_init.num_cpus=2", "ray_kwargs.ray_init.num_cpus=3"], "set one of them"),
    ],
)
def test_two_spellings_of_one_setting_must_agree(overrides, message):
    cfg = load_config("grpo_tiny", overrides)
    with pytest.raises(ConfigValidationError, match=message):
        validate_config(cfg, check_files=False)


def test_verls_new_spellings_reach_the_keys_the_engine_reads():
    cfg = load_config(
        "grpo_tiny",
        [
            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
            "actor_rollout_ref.actor.optim.clip_grad=0.3",
            "critic.optim.warmup_style=null",
            "ray_kwargs.ray_init.num_cpus=2",
        ],
    )
    validate_config(cfg, check_files=False)
    resolved = resolve_config(cfg)
    assert resolved.actor_rollout_ref.actor.optim.warmup_style == "cosine"
    assert resolved.actor_rollout_ref.actor.grad_clip == 0.3
    assert resolved.critic.optim.warmup_style == "constant"
    assert resolved.ray_init.num_cpus == 2


def test_references_read_as_verl_reads_them():
    cfg = load_config(
        "grpo_tiny",
        [
            "critic.forward_max_token_len_per_gpu=${.ppo_max_token_len_per_gpu}",
            "actor_rollout_ref.actor.rollout_n=${oc.select:actor_rollout_ref.rollout.n,1}",
            "critic.rollout_n=${oc.select:no.such.key,4}",
        ],
    )
    assert cfg.critic.forward_max_token_len_per_gpu == cfg.critic.ppo_max_token_len_per_gpu
    assert cfg.actor_rollout_ref.actor.rollout_n == cfg.actor_rollout_ref.rollout.n
    assert cfg.critic.rollout_n == 4


def test_the_config_tables_command_checks_freshness():
    result = subprocess.run(
        [sys.executable, "-m", "engine.config.tables", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


def test_every_honoured_key_is_named_by_a_test():
    """An honoured key changes what the engine does, so some test sets or reads it: by its dotted
    key, its section and name (``optim.lr``), or its name as a keyword, attribute or string."""
    tests = "\n".join(path.read_text() for path in (REPO / "tests").rglob("test_*.py"))
    unnamed = []
    for key, spec in SPECS.items():
        if spec.effect != HONOURED:
            continue
        parts = key.split(".")
        leaf = re.escape(parts[-1])
        patterns = [
            re.escape(key),
            re.escape(".".join(parts[-2:])),
            rf"\b{leaf}\s*=",
            rf"\.{leaf}\b",
            rf"[\"']{leaf}[\"']",
        ]
        if not any(re.search(pattern, tests) for pattern in patterns):
            unnamed.append(key)
    assert unnamed == []


BUCKET = "actor_rollout_ref.rollout.update_weights_bucket_megabytes"
MAIN_BUCKET = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"


@pytest.mark.parametrize(
    ("overrides", "megabytes", "notes"),
    [
        ([], 2048, 0),  # verl main's default
        ([f"{MAIN_BUCKET}=256"], 256, 0),
        ([f"{BUCKET}=128"], 128, 1),  # verl 0.7's spelling: read, with one note
        ([f"{BUCKET}=128", f"{MAIN_BUCKET}=128"], 128, 1),
    ],
)
def test_the_bucket_size_is_read_under_both_spellings(overrides, megabytes, notes):
    cfg = load_config("grpo_tiny", overrides)
    warnings = validate_config(cfg, check_files=False)
    assert len([w for w in warnings if w.startswith(f"[DEPRECATED] {BUCKET}")]) == notes
    rollout = resolve_config(cfg).actor_rollout_ref.rollout
    assert rollout.checkpoint_engine.update_weights_bucket_megabytes == megabytes
    from engine.rollout.served import bucket_megabytes

    assert bucket_megabytes(rollout) == megabytes


def test_the_two_bucket_spellings_set_apart_are_an_error():
    cfg = load_config("grpo_tiny", [f"{BUCKET}=128", f"{MAIN_BUCKET}=256"])
    with pytest.raises(ConfigValidationError, match="the two name one setting"):
        validate_config(cfg, check_files=False)


RC = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    ("overrides", "spelling"),
    [
        (
            [f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=2.0"],
            "rollout_rs=token_k1 rollout_rs_threshold='0.5_2'",
        ),
        (
            [
                f"{RC}.rollout_rs=geometric",
                f"{RC}.rollout_rs_threshold=1.25",
                f"{RC}.rollout_rs_threshold_lower=0.5",
            ],
            "rollout_rs=seq_mean_k1 rollout_rs_threshold='0.8_2'",
        ),
        ([f"{RC}.rollout_token_veto_threshold=0.0001"], "verl main removed it"),
    ],
)
def test_verl_0_7s_rejection_keys_still_work_with_one_note_naming_mains_spelling(
    overrides, spelling
):
    warnings = validate_config(load_config("grpo_tiny", overrides), check_files=False)
    deprecated = [w for w in warnings if w.startswith("[DEPRECATED]")]
    assert len(deprecated) == 1 and spelling in deprecated[0], deprecated


def test_the_rollouts_mtp_section_follows_the_models_as_verl_main_writes_it():
    cfg = load_config(
        str(VERL_MAIN_FILE),
        [*VERL_FILE_OVERRIDES, "actor_rollout_ref.model.mtp.num_speculative_tokens=3"],
    )
    assert cfg.actor_rollout_ref.rollout.mtp.num_speculative_tokens == 3
    with pytest.raises(ConfigValidationError, match="model.mtp.enable"):
        validate_config(
            load_config("grpo_tiny", ["actor_rollout_ref.model.mtp.enable=True"]),
            check_files=False,
        )


def test_prefix_grouper_is_the_prompt_sharing_the_forwards_always_do():
    spec = SPECS["actor_rollout_ref.actor.use_prefix_grouper"]
    assert spec.effect == NO_EFFECT and "engine.roles.packing" in spec.help
    cfg = load_config("grpo_tiny", ["actor_rollout_ref.actor.use_prefix_grouper=True"])
    warnings = validate_config(cfg, check_files=False)
    assert any("use_prefix_grouper=True" in w for w in warnings if w.startswith("no effect"))
