"""verl's example scripts read without running them, then loaded and validated one by one.

The stored scripts are verl's own, unchanged (``tests/third_party/verl/scripts``): three of
verl main's (``examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh``,
``examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh``,
``examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh``) and verl 0.7's two DAPO scripts. What the reader makes of each is checked against what bash passes
a stub ``python3``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from bench.config import verl_examples
from bench.config.shell_words import command_words
from bench.config.verl_examples import MODULE, check_examples, markdown, summary
from engine.rollout.names import SGLANG_MISSING
from tests.engine.command_line import bash_arguments

DATA = Path(__file__).parents[1] / "third_party" / "verl" / "scripts"
STORED = {
    "cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh": "verl_main_run_cispo_qwen2_5_0_5b_gsm8k.sh",
    "grpo_trainer/run_qwen2-7b_math_trtllm.sh": "verl_main_run_qwen2-7b_math_trtllm.sh",
    "ppo_trainer/run_deepseek7b_llm_pfppo.sh": "verl_main_run_deepseek7b_llm_pfppo.sh",
}
# bash the examples use, in one script: defaults, arithmetic, branches, a function and a loop
# (skipped), arrays, quoting, word splitting, $@, a comment that ends the command.
CONSTRUCTS = r"""set -x
NAME=${NAME:-default value}
: ${UNSET_ONE:=assigned}
SUFFIX=${NAME:+-named}
N=$((1024 * 2))
M=$(( (N + 1024) * 3 / 2 ))
ENGINE=${1:-vllm}
if [ "$ENGINE" = "sglang" ]; then
    MODE=server
elif [[ $N -eq 2048 ]]; then
    MODE=async
else
    MODE=sync
fi
now() {
    date +%s
}
for v in a b; do
    echo "$v"
done
ARR=(
    "first=1"   # a comment in the array
    'second=two words'
)
EXTRA="x.a=1 x.b=2"
export FILES="['$HOME/a.parquet', \"$HOME/b\"]"
PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \
    data.train_files="$FILES" \
    trainer.experiment_name=run${SUFFIX}_$N \
    data.max=$M \
    rollout.mode=$MODE \
    "${ARR[@]}" \
    $EXTRA \
    'quoted=$NOT' \
    "escaped=\$HOME" \
    unset.default=${UNSET_ONE} \
    empty="" \
    trainer.total_epochs=15 $@ "${@:2}" \
    # trainer.commented=1 \
    trainer.after_comment=1 2>&1 | tee log.txt
"""


def _scripts() -> list[tuple[str, Path]]:
    stored = [(name, DATA / file) for name, file in STORED.items()]
    dapo = [(path.name, path) for path in sorted(DATA.glob("verl_0_7_*.sh"))]
    return stored + dapo


@pytest.mark.parametrize(("name", "script"), [*_scripts(), ("constructs.sh", None)])
def test_the_reader_finds_the_arguments_bash_passes(name, script, tmp_path):
    constructs = script is None
    if constructs:
        script = tmp_path / name
        script.write_text(CONSTRUCTS)
    text = script.read_text()
    env = {"HOME": "/root", "PWD": str(tmp_path), "LANG": "C.UTF-8"}
    marker = "recipe.dapo.main_dapo" if "recipe" in text and MODULE not in text else MODULE
    passed = bash_arguments(script, marker, tmp_path, env)
    read = command_words(text, marker, env)
    assert read is not None
    assert read[read.index("-m") + 1 :] == passed[1:]
    if constructs:  # the constructs: what bash makes of them, spelled out
        assert passed[2:] == [
            "data.train_files=['/root/a.parquet', \"/root/b\"]",
            "trainer.experiment_name=run-named_2048",
            "data.max=4608",
            "rollout.mode=async",
            "first=1",
            "second=two words",
            "x.a=1",
            "x.b=2",
            "quoted=$NOT",
            "escaped=$HOME",
            "unset.default=assigned",
            "empty=",
            "trainer.total_epochs=15",
        ]


def _verl_checkout(tmp_path: Path) -> Path:
    """Return a folder laid out as verl's: the stored scripts and three made-up ones."""
    verl = tmp_path / "verl"
    for name, file in STORED.items():
        (verl / "examples" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / file, verl / "examples" / name)
    made_up = {
        "grpo_trainer/run_megatron.sh": "--config-name='ppo_megatron_trainer.yaml' x.y=1",
        "grpo_trainer/run_strategy.sh": "actor_rollout_ref.actor.strategy=megatron",
        "grpo_trainer/run_qwen3-8b_npu.sh": "trainer.n_gpus_per_node=16",
        "grpo_trainer/run_sglang.sh": (
            "data.train_files=$HOME/data/train.parquet actor_rollout_ref.model.path=Qwen/Qwen3-8B "
            "actor_rollout_ref.rollout.name=sglang $@"
        ),
    }
    for name, arguments in made_up.items():
        (verl / "examples" / name).write_text(f"python3 -m {MODULE} {arguments}\n")
    (verl / "examples" / "preprocess.sh").write_text("python3 examples/data_preprocess/gsm8k.py\n")
    return verl


def test_each_fsdp_script_is_loaded_and_validated_and_the_rest_set_aside(tmp_path):
    examples = {e.path: e for e in check_examples(_verl_checkout(tmp_path))}
    assert {path: e.kind for path, e in examples.items()} == {
        "examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh": "fsdp",
        "examples/grpo_trainer/run_megatron.sh": "megatron",
        "examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh": "fsdp",
        "examples/grpo_trainer/run_qwen3-8b_npu.sh": "npu",
        "examples/grpo_trainer/run_sglang.sh": "fsdp",
        "examples/grpo_trainer/run_strategy.sh": "megatron",
        "examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh": "fsdp",
    }  # preprocess.sh runs no trainer: not listed

    # verl's CISPO script spells the model's dtype actor_rollout_ref.model.torch_dtype, which
    # verl itself has no key for; here it is the dtype alias (the rollout's dtype).
    cispo = examples["examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh"]
    assert (cispo.loads, cispo.validates, cispo.errors) == (True, True, [])
    assert "actor_rollout_ref.model.torch_dtype=bfloat16" in cispo.overrides

    trtllm = examples["examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh"]
    assert trtllm.loads and not trtllm.validates
    assert dict(trtllm.errors) == {
        "actor_rollout_ref.rollout.name": "must be one of hf, vllm, sglang (did you mean vllm?)",
        "actor_rollout_ref.rollout.engine_kwargs.trtllm": (
            "not supported here: TensorRT-LLM is not a rollout backend here; use "
            "rollout.name=vllm or hf"
        ),
    }
    assert "actor_rollout_ref.rollout.max_num_seqs=1024" in trtllm.overrides  # TP=${1:-4}: 4

    pfppo = examples["examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh"]
    assert pfppo.overrides[-1] == " "  # "pow \  # [...]": a lone space, and the command ends
    assert not pfppo.loads
    assert pfppo.errors == [
        ("", "not an override; write key=value, +key=value, ++key=value or ~key")
    ]

    counts = summary(list(examples.values()))
    assert (counts["fsdp"], counts["megatron"], counts["npu"], counts["unknown_keys"]) == (
        4,
        2,
        1,
        0,
    )


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang installed")
def test_a_script_on_sglang_stops_only_on_the_missing_extra(tmp_path):
    (sglang,) = [
        e for e in check_examples(_verl_checkout(tmp_path)) if e.path.endswith("run_sglang.sh")
    ]
    assert sglang.loads and sglang.only_missing_package
    assert sglang.errors == [("actor_rollout_ref.rollout.name", SGLANG_MISSING)]
    assert "pip install -e .[sglang]" in SGLANG_MISSING


def test_the_markdown_names_each_refusal_with_its_scripts_and_notes(tmp_path, monkeypatch):
    examples = check_examples(_verl_checkout(tmp_path))
    pfppo = ("ppo_trainer/run_deepseek7b_llm_pfppo.sh", "")
    monkeypatch.setattr(verl_examples, "SCRIPT_NOTES", {pfppo: "the script's fault: a space"})
    text = markdown(examples, "main at abc")
    assert text.startswith("Of verl's example scripts (main at abc), 7 call ")
    assert "**3 load** (`--cfg job`) and **1 pass validation**" in text
    assert (
        "| an argument (1) | not an override; write key=value, +key=value, ++key=value or ~key "
        "| `ppo_trainer/run_deepseek7b_llm_pfppo.sh` (the script's fault: a space) |"
    ) in text.splitlines()

    # A note for a refusal that no longer happens is an error, not a stale line.
    gone = ("cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh", "actor_rollout_ref.model.path")
    monkeypatch.setattr(verl_examples, "SCRIPT_NOTES", {gone: "gone"})
    with pytest.raises(SystemExit, match="no longer occur"):
        markdown(examples, "main")


def test_the_command_line_writes_the_data_file_docs_config_md_embeds(tmp_path, capsys):
    out = tmp_path / "verl_examples.md"
    verl = _verl_checkout(tmp_path)
    with pytest.raises(SystemExit, match="no longer occur"):  # the real notes: verl's scripts
        verl_examples.main(["--verl-dir", str(verl), "--markdown", str(out)])
    assert verl_examples.main(["--verl-dir", str(verl), "--json", str(tmp_path / "e.json")]) == 0
    table = capsys.readouterr().out
    assert "validates examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh" in table
    assert "megatron  examples/grpo_trainer/run_megatron.sh" in table
    with pytest.raises(SystemExit):
        verl_examples.main(["--verl-dir", str(tmp_path / "nowhere")])
    assert os.path.exists(tmp_path / "e.json")
