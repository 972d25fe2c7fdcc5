import pytest
import torch

from engine.rewards.reward_model import RewardModelScorer

PROMPTS = ["what is 2+2?", "hi", "name a colour", "x", "add 13 and 29"]
RESPONSES = ["4", "hello there, friend", "blue", "yy", "the sum is 42"]


def test_score_is_the_classifier_logit_at_the_last_token(reward_model_scorer):
    scorer = reward_model_scorer
    ids = scorer.tokenizer("what is 2+2?4", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = scorer.model.model(input_ids=ids).last_hidden_state  # (1, seq, hidden)
        expected = scorer.model.score(hidden[:, -1])[0, 0].item()
    assert scorer.score(["what is 2+2?"], ["4"]) == [pytest.approx(expected, abs=1e-5)]


def test_scores_are_deterministic_and_differ_between_inputs(reward_model_scorer, reward_model_dirs):
    first = reward_model_scorer.score(PROMPTS, RESPONSES)
    assert reward_model_scorer.score(PROMPTS, RESPONSES) == first
    model_dir, tokenizer_dir = reward_model_dirs
    reloaded = RewardModelScorer(model_dir, tokenizer_path=tokenizer_dir, micro_batch_size=5)
    assert reloaded.score(PROMPTS, RESPONSES) == pytest.approx(first, abs=1e-5)
    assert len(set(round(s, 6) for s in first)) == len(first)


def test_batched_equals_unbatched(reward_model_scorer):
    batched = reward_model_scorer.score(PROMPTS, RESPONSES)  # micro-batches of 2, padded
    single = [
        reward_model_scorer.score([p], [r])[0] for p, r in zip(PROMPTS, RESPONSES, strict=True)
    ]
    assert batched == pytest.approx(single, abs=1e-5)


def test_mismatched_lengths_and_bad_settings_are_errors(reward_model_scorer, reward_model_dirs):
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        reward_model_scorer.score(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="micro_batch_size"):
        RewardModelScorer(
            reward_model_dirs[0], tokenizer_path=reward_model_dirs[1], micro_batch_size=0
        )


def test_with_offload_the_parameters_go_to_the_device_only_while_scoring(
    reward_model_dirs, monkeypatch
):
    scorer = RewardModelScorer(
        reward_model_dirs[0], tokenizer_path=reward_model_dirs[1], micro_batch_size=2, offload=True
    )
    expected = RewardModelScorer(
        reward_model_dirs[0], tokenizer_path=reward_model_dirs[1], micro_batch_size=2
    ).score(PROMPTS, RESPONSES)
    moves = []
    forward = scorer.model.forward
    to = scorer.model.to

    def spy_to(device):
        moves.append(str(device))
        return to(device)

    def spy_forward(*args, **kwargs):
        moves.append("forward")
        return forward(*args, **kwargs)

    monkeypatch.setattr(scorer.model, "to", spy_to)
    monkeypatch.setattr(scorer.model, "forward", spy_forward)
    assert scorer.score(PROMPTS, RESPONSES) == pytest.approx(expected, abs=1e-6)
    # On this CPU the scoring device is the CPU too; the order is what a GPU run does: to the
    # device, every micro-batch's forward, back to the CPU.
    assert moves == ["cpu", "forward", "forward", "forward", "cpu"]
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        scorer.score(["a", "b"], ["c"])
    assert moves[-1] == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_with_offload_the_gpu_holds_the_reward_model_only_while_scoring(reward_model_dirs):
    scorer = RewardModelScorer(
        reward_model_dirs[0],
        tokenizer_path=reward_model_dirs[1],
        micro_batch_size=2,
        device="cuda",
        offload=True,
    )
    assert all(p.device.type == "cpu" for p in scorer.model.parameters())
    on_gpu = RewardModelScorer(
        reward_model_dirs[0], tokenizer_path=reward_model_dirs[1], micro_batch_size=2, device="cuda"
    )
    assert scorer.score(PROMPTS, RESPONSES) == pytest.approx(
        on_gpu.score(PROMPTS, RESPONSES), abs=1e-4
    )
    assert all(p.device.type == "cpu" for p in scorer.model.parameters())
