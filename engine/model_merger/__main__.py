"""Merge a checkpoint into a Hugging Face folder, or compare it to one: verl's command line.

    python -m engine.model_merger merge --backend fsdp \\
        --local_dir checkpoints/<run>/global_step_10/actor --target_dir merged/
    python -m engine.model_merger test --backend fsdp \\
        --local_dir checkpoints/<run>/global_step_10/actor --test_hf_dir merged/

``--local_dir`` is one role of a checkpoint (``actor`` or ``critic``), written by the
single-process trainer or by a Ray/FSDP2 run. Without ``<local_dir>/huggingface`` (a run that
did not save ``hf_model``), ``--hf_model_path`` names the model the run started from. Nothing is
uploaded: ``--hf_upload_path`` and ``--private`` are refused.
"""

from __future__ import annotations

import argparse
import json
import sys

from engine.model_merger.merge import MergeError, compare_to_reference, merge_checkpoint


def build_parser() -> argparse.ArgumentParser:
    """Return the parser: verl's ``merge`` and ``test`` operations and their flags."""
    parser = argparse.ArgumentParser(
        prog="python -m engine.model_merger", description=__doc__.split("\n")[0]
    )
    operations = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--backend",
        required=True,
        choices=["fsdp", "megatron"],
        help="the trainer that wrote the checkpoint; this engine writes fsdp checkpoints only",
    )
    common.add_argument(
        "--local_dir", required=True, help="a checkpoint role: .../global_step_<N>/actor or /critic"
    )
    common.add_argument(
        "--hf_model_path",
        default=None,
        help="the model the run started from (config and tokenizer), when the checkpoint has "
        "no huggingface/ folder; tiny://model accepted",
    )
    common.add_argument(
        "--tie-word-embedding",
        action="store_true",
        help="tie the output head to the input embeddings in the merged config",
    )
    common.add_argument(
        "--trust-remote-code", action="store_true", help="allow the config's own model code"
    )
    common.add_argument(
        "--is-value-model",
        action="store_true",
        help="require a critic checkpoint (one is recognised by its score head anyway)",
    )
    merge = operations.add_parser("merge", parents=[common], help="write a Hugging Face folder")
    merge.add_argument("--target_dir", default="tmp", help="the folder to write")
    merge.add_argument(
        "--save-lora-adapter",
        action="store_true",
        help="also write the LoRA adapter alone to <target_dir>/lora_adapter, with the LoRA "
        "settings it trained with (peft.PeftModel.from_pretrained loads it)",
    )
    merge.add_argument("--hf_upload_path", default=None, help="refused: nothing is uploaded")
    merge.add_argument("--private", action="store_true", help="refused: nothing is uploaded")
    test = operations.add_parser(
        "test", parents=[common], help="compare the checkpoint to a Hugging Face folder"
    )
    test.add_argument("--test_hf_dir", required=True, help="the reference Hugging Face folder")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Raise MergeError for the flags this engine refuses, saying what to do instead."""
    if args.backend == "megatron":
        raise MergeError(
            "--backend megatron: this engine trains with FSDP2 only and never writes Megatron "
            "checkpoints; use --backend fsdp"
        )
    if getattr(args, "hf_upload_path", None) or getattr(args, "private", False):
        raise MergeError(
            "--hf_upload_path / --private: this merger uploads nothing (the machine may have no "
            "network); merge to --target_dir, then upload that folder with "
            "`huggingface-cli upload <repo> <target_dir>`"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.env import apply_cpu_process_env

    apply_cpu_process_env()
    options = dict(
        hf_model_path=args.hf_model_path,
        trust_remote_code=args.trust_remote_code,
        tie_word_embedding=args.tie_word_embedding,
        expect_value_model=args.is_value_model,
    )
    try:
        check_args(args)
        if args.operation == "merge":
            target = merge_checkpoint(
                args.local_dir,
                args.target_dir,
                save_lora_adapter=args.save_lora_adapter,
                **options,
            )
            print(f"merged {args.local_dir} into {target}")
        else:
            result = compare_to_reference(args.local_dir, args.test_hf_dir, **options)
            print(f"{args.local_dir} matches {args.test_hf_dir}: {json.dumps(result)}")
    except (FileNotFoundError, MergeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
