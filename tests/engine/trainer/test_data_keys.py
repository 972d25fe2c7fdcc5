"""``data.tokenizer``, ``model.custom_chat_template`` and ``data.return_raw_chat`` (tiny, CPU)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from engine.data.dataset import RLHFDataset
from engine.trainer import PPOTrainer
from engine.trainer.run import run_training
from tests.engine.trainer.test_trainer import ListRecorder

# Renders "87+22=" as "<bos>Q: 87+22= A:" (the tiny model's own template: "<bos><|user|>87+22=...").
QA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}Q: {{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %} A:{% endif %}"
)


@pytest.fixture
def qa_tokenizer_dir(tiny_assets, tmp_path):
    """The tiny tokenizer saved with another chat template (same vocabulary)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.model_dir)
    tokenizer.chat_template = QA_TEMPLATE
    folder = tmp_path / "qa_tokenizer"
    tokenizer.save_pretrained(folder)
    return folder


def test_data_tokenizer_formats_the_prompts(make_config, qa_tokenizer_dir):
    trainer = PPOTrainer(make_config("grpo_tiny", f"data.tokenizer={qa_tokenizer_dir}"))
    item = trainer.train_dataset[0]
    question = item["raw_prompt"][0]["content"]
    assert item["prompt_text"] == f"<bos>Q: {question} A:"
    assert item["input_ids"].tolist() == trainer.tokenizer.encode(
        item["prompt_text"], add_special_tokens=False
    )
    # The policy's own tokenizer keeps its template; without the key the data uses it.
    assert trainer.tokenizer.chat_template != QA_TEMPLATE
    plain = PPOTrainer(make_config("grpo_tiny"))
    assert plain.train_dataset[0]["prompt_text"].startswith("<bos><|user|>")


def test_a_data_tokenizer_with_another_vocabulary_is_refused(make_config, tiny_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.model_dir)
    tokenizer.add_tokens(["<extra_token>"])
    tokenizer.save_pretrained(tmp_path / "other")
    config = make_config("grpo_tiny", f"data.tokenizer={tmp_path / 'other'}")
    with pytest.raises(ValueError, match=r"data.tokenizer=.* different vocabulary .*<extra_token>"):
        PPOTrainer(config)


def test_custom_chat_template_formats_every_prompt(make_config):
    config = make_config("grpo_tiny", "trainer.total_training_steps=1")
    config.actor_rollout_ref.model.custom_chat_template = QA_TEMPLATE
    trainer = PPOTrainer(config)
    item = trainer.val_dataset[0]
    assert item["prompt_text"] == f"<bos>Q: {item['raw_prompt'][0]['content']} A:"
    # The worker's tokenizer (multi-turn rollouts render with it) has the template too.
    assert trainer.arr.tokenizer.chat_template == QA_TEMPLATE
    recorder = ListRecorder()
    trainer.recorder = recorder
    assert trainer.fit() == "succeeded"
    assert all(s.prompt_text.startswith("<bos>Q: ") for s in recorder.samples)


def test_return_raw_chat_hands_the_messages_to_the_reward_function(make_config, tmp_path):
    reward_file = tmp_path / "chat_reward.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    messages = (extra_info or {}).get('raw_prompt')\n"
        "    return {'score': 0.0, 'saw_chat': float(messages is not None),\n"
        "            'question_len': float(len(messages[0]['content']) if messages else -1)}\n"
    )
    seen = {}
    for flag in (True, False):
        config = make_config(
            "grpo_tiny",
            "trainer.total_training_steps=1",
            f"custom_reward_function.path={reward_file}",
            f"data.return_raw_chat={flag}",
        )
        recorder = ListRecorder()
        assert run_training(config, recorder) == "succeeded"
        seen[flag] = recorder.samples
    assert all(s.reward_parts["saw_chat"] == 1.0 for s in seen[True])
    assert all(
        s.reward_parts["question_len"] == len(s.prompt_text.split("<|user|>")[1].split("<")[0])
        for s in seen[True]
    )
    assert all(s.reward_parts["saw_chat"] == 0.0 for s in seen[False])


def test_return_raw_chat_leaves_the_row_untouched(tiny_assets, make_config):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.model_dir)
    data = make_config("grpo_tiny", "data.return_raw_chat=True").data
    dataset = RLHFDataset([str(tiny_assets.val_parquet)], tokenizer, data)
    item = dataset[0]
    assert item["extra_info"]["raw_prompt"] == item["raw_prompt"] == dataset.rows[0]["raw_prompt"]
    assert "raw_prompt" not in dataset.rows[0]["extra_info"]  # a copy, not the stored row
    data.return_raw_chat = False
    assert (
        "raw_prompt"
        not in RLHFDataset([str(tiny_assets.val_parquet)], tokenizer, data)[0]["extra_info"]
    )
