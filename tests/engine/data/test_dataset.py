"""RLHFDataset and collate_prompts on small files in every format, with a character tokenizer."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from engine.data.dataset import DatasetError, RLHFDataset, collate_prompts, truncate_ids
from engine.data.proto import DataProto
from tests.engine.data.helpers import (
    TEMPLATE_TOKENS,
    data_config,
    verl_row,
    write_csv,
    write_jsonl,
    write_parquet,
)

QA_MAP = {"prompt": "question", "ground_truth": "answer"}


def expected_ids(tok, content: str) -> list[int]:
    """Token ids of <bos><|user|>content<|assistant|> for the character tokenizer."""
    return tok.convert_tokens_to_ids(["<bos>", "<|user|>", *content, "<|assistant|>"])


def test_verl_parquet_item(tmp_path, char_tokenizer):
    path = write_parquet(tmp_path / "train.parquet", [verl_row("1+2=", "3"), verl_row("9-4=", "5")])
    dataset = RLHFDataset(str(path), char_tokenizer, data_config())
    assert len(dataset) == 2
    item = dataset[1]
    assert item["input_ids"].dtype == torch.long
    assert item["input_ids"].tolist() == expected_ids(char_tokenizer, "9-4=")
    assert item["input_ids"].tolist().count(char_tokenizer.bos_token_id) == 1
    assert item["prompt_text"] == "<bos><|user|>9-4=<|assistant|>"
    assert item["raw_prompt"] == [{"role": "user", "content": "9-4="}]
    assert item["data_source"] == "gsm8k" and item["ability"] == "math" and item["index"] == 1
    assert item["reward_model"] == {"style": "rule", "ground_truth": "5"}
    assert item["extra_info"] == {"split": "train", "answer": "#### 5"}


def test_jsonl_with_data_key_map(tmp_path, char_tokenizer):
    path = write_jsonl(
        tmp_path / "arith.jsonl",
        [{"question": "2*3=", "answer": "6", "level": 1}, {"question": "7+1=", "answer": 8}],
    )
    dataset = RLHFDataset([path], char_tokenizer, data_config(data_key_map=QA_MAP))
    item = dataset[0]
    assert item["raw_prompt"] == [{"role": "user", "content": "2*3="}]
    assert item["reward_model"] == {"style": "rule", "ground_truth": "6"}
    assert item["data_source"] == "arith"  # the file's stem when no data_source column
    assert item["extra_info"] == {"level": 1}
    assert dataset[1]["reward_model"]["ground_truth"] == 8
    assert item["ability"] == "unknown"


def test_file_key_maps_apply_only_to_their_file(tmp_path, char_tokenizer):
    """An upload's map (question -> prompt) must not touch a verl file read beside it."""
    upload = write_jsonl(tmp_path / "mine.jsonl", [{"question": "2*3=", "answer": "6"}])
    verl = write_parquet(tmp_path / "val.parquet", [verl_row("1+2=", "3")])
    config = data_config(
        file_key_maps={"uploads/mine.jsonl": QA_MAP},
        file_data_sources={"uploads/mine.jsonl": "tiny_arithmetic"},
    )
    dataset = RLHFDataset(
        [upload, verl], char_tokenizer, config, names=["uploads/mine.jsonl", "tiny://val"]
    )
    mine, theirs = dataset[0], dataset[1]
    assert mine["raw_prompt"] == [{"role": "user", "content": "2*3="}]
    assert mine["data_source"] == "tiny_arithmetic"
    assert mine["reward_model"]["ground_truth"] == "6"
    assert theirs["raw_prompt"] == [{"role": "user", "content": "1+2="}]
    assert theirs["data_source"] == "gsm8k"


def test_global_key_map_on_a_verl_file_names_the_missing_column(tmp_path, char_tokenizer):
    verl = write_parquet(tmp_path / "val.parquet", [verl_row("1+2=", "3")])
    with pytest.raises(DatasetError, match=r"column 'question' \(data.data_key_map.prompt\)"):
        RLHFDataset([verl], char_tokenizer, data_config(data_key_map=QA_MAP))


def test_jsonl_with_verl_column_names_needs_no_map(tmp_path, char_tokenizer):
    path = write_jsonl(
        tmp_path / "x.json",
        [
            {
                "prompt": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                ],
                "ground_truth": "hello",
                "data_source": "chat",
            }
        ],
    )
    item = RLHFDataset(str(path), char_tokenizer, data_config())[0]
    assert item["prompt_text"] == "<bos><|system|>be brief<|user|>hi<|assistant|>"
    assert item["reward_model"]["ground_truth"] == "hello" and item["data_source"] == "chat"


def test_csv_with_map_and_several_files_concatenate(tmp_path, char_tokenizer):
    first = write_csv(
        tmp_path / "a.csv", ["q", "a", "note"], [["1+1=", "2", "x, y"], ["2+2=", "4", ""]]
    )
    second = write_jsonl(tmp_path / "b.jsonl", [{"q": "3+3=", "a": "6"}])
    config = data_config(data_key_map={"prompt": "q", "ground_truth": "a"})
    dataset = RLHFDataset([str(first), str(second)], char_tokenizer, config)
    assert len(dataset) == 3
    assert [dataset[i]["data_source"] for i in range(3)] == ["a", "a", "b"]
    assert [dataset[i]["index"] for i in range(3)] == [0, 1, 2]
    assert dataset[0]["extra_info"] == {"note": "x, y"}
    assert dataset[2]["raw_prompt"][0]["content"] == "3+3="
    assert dataset[1]["reward_model"]["ground_truth"] == "4"


def test_prompt_key_setting(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"text": "ab"}])
    item = RLHFDataset(str(path), char_tokenizer, data_config(prompt_key="text"))[0]
    assert item["input_ids"].tolist() == expected_ids(char_tokenizer, "ab")


def test_reward_fn_key_column_is_carried(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "ab", "task": "sql"}])
    item = RLHFDataset(str(path), char_tokenizer, data_config(reward_fn_key="task"))[0]
    assert item["task"] == "sql"
    with pytest.raises(DatasetError, match=r"r.jsonl, line 1: no column 'kind'.*reward_fn_key"):
        RLHFDataset(str(path), char_tokenizer, data_config(reward_fn_key="kind"))


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        ("left", ["e", "f", "g", "h", "<|assistant|>"]),
        ("right", ["<bos>", "<|user|>", "a", "b", "c"]),
        ("middle", ["<bos>", "<|user|>", "g", "h", "<|assistant|>"]),
    ],
)
def test_truncation_modes(tmp_path, char_tokenizer, mode, kept):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "abcdefgh"}, {"prompt": "ab"}])
    dataset = RLHFDataset(
        str(path), char_tokenizer, data_config(max_prompt_length=5, truncation=mode)
    )
    assert char_tokenizer.convert_ids_to_tokens(dataset[0]["input_ids"].tolist()) == kept
    assert dataset[1]["input_ids"].tolist() == expected_ids(char_tokenizer, "ab")  # 5 tokens: kept


def test_truncate_ids_edges():
    assert truncate_ids([1, 2, 3], 3, "error") == [1, 2, 3]
    assert truncate_ids([1, 2, 3, 4, 5], 1, "middle") == [5]
    with pytest.raises(ValueError, match="mode 'error'"):
        truncate_ids([1, 2, 3], 2, "error")


def test_truncation_error_names_row_length_and_fixes(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "ab"}, {"prompt": "abcdefgh"}])
    with pytest.raises(DatasetError) as info:
        RLHFDataset(str(path), char_tokenizer, data_config(max_prompt_length=5))
    message = str(info.value)
    assert "long.jsonl, line 2" in message
    assert f"{8 + TEMPLATE_TOKENS} tokens" in message
    assert "data.max_prompt_length=5" in message and "data.filter_overlong_prompts=True" in message


def test_filter_overlong_prompts(tmp_path, char_tokenizer):
    path = write_jsonl(
        tmp_path / "f.jsonl", [{"prompt": "abcdefgh"}, {"prompt": "ab"}, {"prompt": "abc"}]
    )
    config = data_config(max_prompt_length=5, filter_overlong_prompts=True)
    dataset = RLHFDataset(str(path), char_tokenizer, config)
    assert dataset.num_filtered == 2 and len(dataset) == 1
    assert dataset[0]["index"] == 1  # the source row's position, not the filtered one
    with pytest.raises(DatasetError, match="all 3 were longer than data.max_prompt_length=2"):
        RLHFDataset(
            str(path),
            char_tokenizer,
            data_config(max_prompt_length=2, filter_overlong_prompts=True),
        )


def errors_for(tmp_path, tok, text: str, name: str = "bad.jsonl", **config) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        RLHFDataset(str(path), tok, data_config(**config))
    return str(info.value)


def test_bad_json_line_names_file_and_line(tmp_path, char_tokenizer):
    text = '{"prompt": "a"}\n\n{"prompt": "b",\n'
    message = errors_for(tmp_path, char_tokenizer, text)
    assert f"{tmp_path / 'bad.jsonl'}, line 3: invalid JSON" in message
    assert "one complete JSON object" in message


def test_json_array_file_gets_jsonl_hint(tmp_path, char_tokenizer):
    text = json.dumps([{"prompt": "a"}, {"prompt": "b"}], indent=1)
    message = errors_for(tmp_path, char_tokenizer, text, name="arr.json")
    assert "arr.json, line 1" in message and "one object per line" in message


def test_non_object_line(tmp_path, char_tokenizer):
    message = errors_for(tmp_path, char_tokenizer, '{"prompt": "a"}\n["a", "b"]\n')
    assert "line 2: expected a JSON object" in message and "got list" in message


def test_missing_prompt_column_lists_columns_and_fix(tmp_path, char_tokenizer):
    message = errors_for(tmp_path, char_tokenizer, '{"question": "a", "answer": "1"}\n')
    assert "bad.jsonl, line 1: no prompt column 'prompt'" in message
    assert "['question', 'answer']" in message
    assert "data.data_key_map.prompt=<column>" in message


def test_mapped_column_missing(tmp_path, char_tokenizer):
    text = '{"question": "a", "answer": "1"}\n{"question": "b"}\n'
    message = errors_for(tmp_path, char_tokenizer, text, data_key_map=QA_MAP)
    assert "line 2: column 'answer' (data.data_key_map.ground_truth) not found" in message
    assert "['question']" in message


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        (42, "holds int 42"),
        ("", "is empty"),
        ([], "is empty"),
        ([{"role": "user"}], "has a message that is not"),
        ([{"role": "user", "content": 3}], "has a message that is not"),
        (["hi"], "has a message that is not"),
    ],
)
def test_bad_prompt_values(tmp_path, char_tokenizer, prompt, problem):
    message = errors_for(tmp_path, char_tokenizer, json.dumps({"prompt": prompt}) + "\n")
    assert "bad.jsonl, line 1: prompt column 'prompt'" in message
    assert problem in message and "data.data_key_map.prompt=<column>" in message


def test_bad_parquet_row_names_row(tmp_path, char_tokenizer):
    path = write_parquet(tmp_path / "p.parquet", [{"prompt": "ok"}, {"prompt": None}])
    with pytest.raises(
        DatasetError, match=r"p.parquet, row 2: prompt column 'prompt' holds NoneType"
    ):
        RLHFDataset(str(path), char_tokenizer, data_config())


def test_reward_model_must_be_an_object(tmp_path, char_tokenizer):
    message = errors_for(tmp_path, char_tokenizer, '{"prompt": "a", "reward_model": "7"}\n')
    assert "line 1: reward_model must be an object" in message
    assert "data.data_key_map.ground_truth=<column>" in message


def test_csv_field_count_mismatch(tmp_path, char_tokenizer):
    text = "prompt,answer\nab,1\nc,d,2\n"
    message = errors_for(tmp_path, char_tokenizer, text, name="bad.csv")
    assert "bad.csv, line 3: 3 fields but the header has 2 (prompt, answer)" in message
    assert "quote values" in message


def test_missing_file_and_unsupported_type(tmp_path, char_tokenizer):
    with pytest.raises(DatasetError, match=f"data file not found: {tmp_path / 'nope.jsonl'}"):
        RLHFDataset(str(tmp_path / "nope.jsonl"), char_tokenizer, data_config())
    with pytest.raises(DatasetError, match=r"unsupported file type '.txt'"):
        RLHFDataset(str(tmp_path / "data.txt"), char_tokenizer, data_config())


def test_bad_settings(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "a"}])
    with pytest.raises(DatasetError, match=r"unknown target\(s\) \['answer'\]"):
        RLHFDataset(str(path), char_tokenizer, data_config(data_key_map={"answer": "a"}))
    with pytest.raises(DatasetError, match="data.truncation='cut' is not one of"):
        RLHFDataset(str(path), char_tokenizer, data_config(truncation="cut"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="the files are empty"):
        RLHFDataset(str(empty), char_tokenizer, data_config())


def test_tokenizer_without_chat_template(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "a"}])
    plain = char_tokenizer.__class__(
        tokenizer_object=char_tokenizer.backend_tokenizer, bos_token="<bos>", pad_token="<pad>"
    )
    with pytest.raises(DatasetError, match="no chat_template"):
        RLHFDataset(str(path), plain, data_config())


def test_collate_left_pads_with_positions(tmp_path, char_tokenizer):
    path = write_jsonl(
        tmp_path / "c.jsonl", [{"prompt": "abc", "answer": "x"}, {"prompt": "a", "answer": "y"}]
    )
    dataset = RLHFDataset(
        str(path), char_tokenizer, data_config(data_key_map={"ground_truth": "answer"})
    )
    pad = char_tokenizer.pad_token_id
    batch = collate_prompts([dataset[0], dataset[1]], pad)
    assert isinstance(batch, DataProto) and len(batch) == 2
    assert batch.batch["input_ids"].shape == (2, 6)
    assert batch.batch["input_ids"][1].tolist() == [pad, pad] + expected_ids(char_tokenizer, "a")
    assert batch.batch["attention_mask"].tolist() == [[1] * 6, [0, 0, 1, 1, 1, 1]]
    assert batch.batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]]
    assert set(batch.non_tensor_batch) == {
        "raw_prompt",
        "prompt_text",
        "data_source",
        "reward_model",
        "extra_info",
        "index",
        "ability",
    }
    assert [r["ground_truth"] for r in batch.non_tensor_batch["reward_model"]] == ["x", "y"]
    assert list(batch.non_tensor_batch["index"]) == [0, 1]
    with pytest.raises(ValueError, match="no pad_token_id"):
        collate_prompts([dataset[0]], None)


def test_omegaconf_section_with_nulls_takes_verl_defaults(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "o.jsonl", [{"question": "ab"}])
    config = OmegaConf.create(
        {"data_key_map": {"prompt": "question"}, "truncation": None, "max_prompt_length": None}
    )
    dataset = RLHFDataset(str(path), char_tokenizer, config)
    assert (dataset.truncation, dataset.max_prompt_length, dataset.prompt_key) == (
        "error",
        1024,
        "prompt",
    )
    assert dataset[0]["input_ids"].tolist() == expected_ids(char_tokenizer, "ab")


def test_build_datasets_reads_an_upload_with_its_map_beside_the_tiny_validation_set(
    tmp_path, char_tokenizer
):
    """The studio's case: the preset's tiny://val.parquet kept beside an uploaded train set."""
    from engine.config import load_config
    from engine.trainer.build import build_datasets

    upload = write_jsonl(tmp_path / "mine.jsonl", [{"question": "2*3=", "answer": "6"}] * 4)
    config = load_config("grpo_tiny")
    config.data.train_files = str(upload)
    config.data.max_prompt_length = 512
    config.data.file_key_maps = {str(upload): QA_MAP}
    config.data.file_data_sources = {str(upload): "tiny_arithmetic"}
    train, val = build_datasets(config, char_tokenizer)
    assert train[0]["data_source"] == "tiny_arithmetic"
    assert train[0]["reward_model"]["ground_truth"] == "6"
    assert val is not None and len(val) > 0
    assert val[0]["data_source"] == "tiny_arithmetic"  # the tiny task's own column
