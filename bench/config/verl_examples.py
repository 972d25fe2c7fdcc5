"""verl's FSDP example scripts through the engine's loader and validation, script by script.

    python -m bench.config.verl_examples --verl-dir ../verl                # one line a script
    python -m bench.config.verl_examples --verl-dir ../verl --verl-ref 'main at b178a3c' \
        --markdown engine/config/verl_examples.md   # docs/config.md's section (then tables --write)

A checkout of verl (any branch) is searched for ``examples/**/*.sh`` that call
``verl.trainer.main_ppo``. Each script's python command is read without running it
(``bench.config.shell_words``): line continuations, the script's variables with the defaults it
sets, ``$1`` and ``$@`` empty as when a user runs the script without arguments, ``$HOME`` is
``/root``, the script runs from the verl checkout (as verl's documentation runs them), and a
SLURM script's ``#SBATCH --nodes`` and ``--gpus-per-node`` give ``SLURM_JOB_NUM_NODES`` and
``SLURM_GPUS_PER_NODE`` as sbatch would. The ``--config-path``/``--config-name`` and overrides
go to ``load_config`` as ``python -m engine.main_ppo ... --cfg job`` loads them, then to
``validate_config`` without the file checks (the data and model paths are the script author's).

Which scripts are set aside, and how they are recognised:

- **Megatron**: the config is verl's ``ppo_megatron_trainer`` or a config of the script's own
  whose name or ``defaults:`` say ``megatron``, or an override sets a ``strategy`` to
  ``megatron``. This engine trains with FSDP only.
- **NPU** (Ascend): an override sets ``trainer.device=npu``, or the file is named ``*npu.sh``
  (verl names its Ascend scripts so; some set no key that says it).

Every other script is an FSDP one and is reported: loads (no unknown key, type or syntax error),
validates, and each error's key and message. ``--json`` writes the whole table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.config.shell_words import ShellError, command_words
from engine.config import ConfigError, ConfigValidationError, load_config, validate_config

MODULE = "verl.trainer.main_ppo"
HOME = "/root"
NPU_SUFFIX = "npu.sh"
LISTED = 8  # scripts named in a row of docs/config.md's table; the rest are counted
# What a refusal's message starts with when the key is not in the schema at all.
UNKNOWN = "unknown key"
# A refusal that only an installed package removes (the extra named in the message).
PACKAGE_MISSING = re.compile(r"is not installed: pip install")


@dataclass
class Example:
    """One script: what kind it is, and for an FSDP one what the engine makes of it."""

    path: str
    kind: str  # "fsdp", "megatron", "npu", or "unread" (no python command found)
    config: str = "ppo_trainer"
    overrides: list[str] = field(default_factory=list)
    loads: bool = False
    validates: bool = False
    errors: list[tuple[str, str]] = field(default_factory=list)  # (key, message)
    warnings: list[str] = field(default_factory=list)

    @property
    def only_missing_package(self) -> bool:
        return bool(self.errors) and all(PACKAGE_MISSING.search(m) for _, m in self.errors)


def example_scripts(verl_dir: Path) -> list[Path]:
    """Return verl's example scripts that call ``verl.trainer.main_ppo``, sorted."""
    return sorted(
        path
        for path in (verl_dir / "examples").rglob("*.sh")
        if MODULE in path.read_text(encoding="utf-8", errors="replace")
    )


def slurm_environment(text: str) -> dict[str, str]:
    """Return what sbatch sets from a script's ``#SBATCH`` lines that verl's scripts read."""
    env = {}
    nodes = re.search(r"^#SBATCH\s+(?:--nodes=|-N\s*)(\d+)", text, re.M)
    gpus = re.search(r"^#SBATCH\s+--gpus-per-node=(\d+)", text, re.M)
    if nodes:
        env["SLURM_JOB_NUM_NODES"] = env["SLURM_NNODES"] = nodes.group(1)
    if gpus:
        env["SLURM_GPUS_PER_NODE"] = gpus.group(1)
    return env


def script_command(path: Path, verl_dir: Path) -> list[str] | None:
    """Return the arguments after ``-m verl.trainer.main_ppo`` in ``path``, or None."""
    text = path.read_text(encoding="utf-8")
    env = {"HOME": HOME, "PWD": str(verl_dir), "USER": "root", **slurm_environment(text)}
    words = command_words(text, MODULE, env)
    if words is None:
        return None
    return words[words.index(MODULE) + 1 :]


def split_hydra_options(arguments: list[str]) -> tuple[str | None, str | None, list[str]]:
    """Return (``--config-path``, ``--config-name``, the overrides) of a hydra command line."""
    options: dict[str, str] = {}
    overrides: list[str] = []
    items = iter(arguments)
    for argument in items:
        flag, equals, value = argument.partition("=")
        names = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}
        if flag in names:
            options[names[flag]] = value if equals else next(items, "")
        else:
            overrides.append(argument)
    return options.get("path"), options.get("name"), overrides


def config_source(verl_dir: Path, folder: str | None, name: str | None) -> str:
    """Return what ``load_config`` reads for hydra's ``--config-path``/``--config-name``: a
    script's own YAML, or the engine's preset of verl's trainer config."""
    name = name or "ppo_trainer"
    if folder is None:
        return name
    path = Path(folder) if Path(folder).is_absolute() else verl_dir / folder
    filename = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    candidate = path / filename
    if candidate.is_file():
        return str(candidate)
    return name  # verl's own configs (ppo_trainer, ...): the engine's presets of the same name


def _kind(path: Path, source: str, overrides: list[str]) -> str:
    text = Path(source).read_text() if Path(source).is_file() else ""
    if "megatron" in Path(source).name or re.search(r"^\s*-\s*\S*megatron", text, re.M):
        return "megatron"
    if any(re.fullmatch(r"\+*[\w.]*strategy=megatron", o) for o in overrides):
        return "megatron"
    if "trainer.device=npu" in overrides or path.name.endswith(NPU_SUFFIX):
        return "npu"
    return "fsdp"


def check_example(path: Path, verl_dir: Path) -> Example:
    """Read ``path``'s command and run it through the loader and the validator."""
    name = str(path.relative_to(verl_dir))
    try:
        arguments = script_command(path, verl_dir)
    except ShellError as exc:
        kind = "npu" if path.name.endswith(NPU_SUFFIX) else "unread"
        return Example(name, kind, errors=[("", str(exc))])
    if arguments is None:
        return Example(name, "unread", errors=[("", f"no command runs {MODULE}")])
    folder, config_name, overrides = split_hydra_options(arguments)
    source = config_source(verl_dir, folder, config_name)
    example = Example(name, _kind(path, source, overrides), source, overrides)
    if example.kind != "fsdp":
        return example
    try:
        config = load_config(source, overrides, all_errors=True)
    except ConfigValidationError as exc:
        example.errors = [(e.key, e.message) for e in exc.errors]
        return example
    except ConfigError as exc:
        example.errors = [("", str(exc))]
        return example
    example.loads = True
    try:
        example.warnings = validate_config(config, check_files=False)
    except ConfigValidationError as exc:
        example.errors = [(e.key, e.message) for e in exc.errors]
        return example
    example.validates = True
    return example


def check_examples(verl_dir: Path) -> list[Example]:
    return [check_example(path, verl_dir) for path in example_scripts(verl_dir)]


def summary(examples: list[Example]) -> dict[str, int]:
    kinds = Counter(e.kind for e in examples)
    fsdp = [e for e in examples if e.kind == "fsdp"]
    unknown = sum(1 for e in fsdp for _, m in e.errors if m.startswith(UNKNOWN))
    return {
        "scripts": len(examples),
        "megatron": kinds["megatron"],
        "npu": kinds["npu"],
        "unread": kinds["unread"],
        "fsdp": len(fsdp),
        "load": sum(e.loads for e in fsdp),
        "validate": sum(e.validates for e in fsdp),
        "only_missing_package": sum(e.only_missing_package for e in fsdp),
        "unknown_keys": unknown,
    }


def refusals(examples: list[Example]) -> dict[tuple[str, str], list[str]]:
    """Return every (key, message) the FSDP scripts meet, with the scripts that meet it, the
    most common first."""
    table: dict[tuple[str, str], list[str]] = {}
    for example in examples:
        if example.kind == "fsdp":
            for key, message in example.errors:
                table.setdefault((key, message), []).append(example.path)
    return dict(sorted(table.items(), key=lambda item: (-len(item[1]), item[0])))


SGLANG_MODE = "actor_rollout_ref.rollout.sglang_rollout_mode"
MICRO_BATCH = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
NO_SGLANG_MODE = (
    "the script's fault: verl main's RolloutConfig has no such field since verl PR #4422"
)
SAME_ASSERT = "the script's fault: verl's FSDP worker asserts the same divisibility"
ROLLOUT_NAME = "actor_rollout_ref.rollout.name"
VERL_SAMPLER = (
    "then its `data.sampler` class, verl's test module `pkg://tests.utils.dataset."
    "test_create_rl_sampler_on_cpu`, imports verl: it loads where verl is installed, else copy "
    "the class importing `engine.data.sampler`"
)
# Why a script meets a refusal, where the script is at fault (verl stops too) or the refusal
# follows from another, or what the script meets after it; keyed by the script (under
# examples/) and the refused key. markdown() fails when one no longer occurs.
SCRIPT_NOTES = {
    ("ppo_trainer/run_deepseek7b_llm_pfppo.sh", ""): (
        "the script's fault: line 6 ends in `\\  # [...]`: bash passes a lone space as an "
        "argument and ends the command there, so the keys after it reach neither verl nor this "
        "engine"
    ),
    (
        "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh",
        "actor_rollout_ref.actor.use_kl_loss",
    ): (
        "the script's fault: it sets the key twice, the second time from `${use_kl_loss}`, "
        "which it never sets"
    ),
    ("tuning/70b/qwen2-70b_grpo_32_h20_fsdp_vllm.sh", "data.train_files"): (
        "the script's fault: `$data_path` is never set, so the value is empty"
    ),
    (
        "grpo_trainer/run_gptoss_20b.sh",
        "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend",
    ): (
        "the script's fault: verl's `engine_kwargs.sglang` is `{}` too, so verl's hydra asks "
        "for the same `+`"
    ),
    (
        "sglang_multiturn/search_r1_like/run_qwen2.5-3b_instruct_search_multiturn.sh",
        "actor_rollout_ref.rollout.multi_turn.format",
    ): (
        "the script's fault: its YAML says `qwen`; verl main's tool parsers are `hermes` and "
        "`gpt-oss`"
    ),
    ("sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_server.sh", SGLANG_MODE): NO_SGLANG_MODE,
    ("sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu_server.sh", SGLANG_MODE): (
        NO_SGLANG_MODE
    ),
    ("sglang_multiturn/run_qwen0.5b_gsm8k_multiturn_curriculum.sh", ROLLOUT_NAME): VERL_SAMPLER,
    (
        "sglang_multiturn/gsm8k_toolcall_shaping/run_gsm8k_grpo_toolcall_shaping.sh",
        ROLLOUT_NAME,
    ): VERL_SAMPLER,
    ("sglang_multiturn/run_qwen3_4b_dapo_multiturn.sh", ROLLOUT_NAME): (
        "then its `data.custom_cls`, `recipe/retool/retool.py` in verl's recipe submodule, "
        "derives from verl's dataset: it loads where verl is installed"
    ),
    ("rollout_correction/run_with_rollout_corr.sh", MICRO_BATCH): SAME_ASSERT,
    ("rollout_correction/run_with_rollout_corr_multi_rs.sh", MICRO_BATCH): SAME_ASSERT,
}


def markdown(examples: list[Example], verl_ref: str) -> str:
    """Return docs/config.md's section: the counts and every refusal with its reason."""
    counts = summary(examples)
    met = {
        (str(Path(path).relative_to("examples")), key)
        for (key, _), paths in refusals(examples).items()
        for path in paths
    }
    stale = [note for note in SCRIPT_NOTES if note not in met]
    if stale:
        raise SystemExit(f"SCRIPT_NOTES names refusals that no longer occur: {stale}")
    lines = [
        f"Of verl's example scripts ({verl_ref}), {counts['scripts']} call `{MODULE}`: "
        f"{counts['megatron']} Megatron and {counts['npu']} NPU ones are set aside, which leaves "
        f"{counts['fsdp']} FSDP scripts. **{counts['load']} load** (`--cfg job`) and "
        f"**{counts['validate']} pass validation**; {counts['only_missing_package']} stop only "
        f"on SGLang, which this machine cannot install; {counts['unknown_keys']} keys are "
        "unknown. The refusals, each with the scripts that meet it (a script can meet several):",
        "",
        "| key (scripts) | refused because | the scripts |",
        "| --- | --- | --- |",
    ]
    for (key, message), paths in refusals(examples).items():
        names = []
        for path in paths:
            name = str(Path(path).relative_to("examples"))
            note = SCRIPT_NOTES.get((name, key))
            names.append(f"`{name}`" + (f" ({note})" if note else ""))
        if len(names) > LISTED:
            names = names[:LISTED] + [f"{len(names) - LISTED} more (`--json` lists them)"]
        cell = message.replace("|", "\\|").replace("\n", " ")
        shown = f"`{key}`" if key else "an argument"  # the key's own row is in a table below
        lines.append(f"| {shown} ({len(paths)}) | {cell} | {', '.join(names)} |")
    return "\n".join(lines) + "\n"


def _table(examples: list[Example]) -> str:
    rows = []
    for e in examples:
        if e.kind != "fsdp":
            rows.append(f"{e.kind:8}  {e.path}")
            continue
        status = "validates" if e.validates else "loads" if e.loads else "refused"
        rows.append(f"{status:9} {e.path}")
        rows += [f"            {key}: {message}" for key, message in e.errors]
    counts = summary(examples)
    rows.append(", ".join(f"{k} {v}" for k, v in counts.items()))
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.config.verl_examples", description=__doc__
    )
    parser.add_argument("--verl-dir", type=Path, required=True, help="a checkout of verl")
    parser.add_argument(
        "--markdown", type=Path, help="write docs/config.md's section here (its data file)"
    )
    parser.add_argument("--verl-ref", default="main", help="which verl: a branch and commit")
    parser.add_argument("--json", type=Path, help="write every script's result here")
    args = parser.parse_args(argv)
    verl_dir = args.verl_dir.resolve()
    if not (verl_dir / "examples").is_dir():
        parser.error(f"{verl_dir} has no examples/ folder: point --verl-dir at a verl checkout")
    examples = check_examples(verl_dir)
    if args.json:
        args.json.write_text(json.dumps([asdict(e) for e in examples], indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(examples, args.verl_ref))
    sys.stdout.write(_table(examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
