"""Masked reductions and log-prob helpers, checked on hand-computed 2x3 inputs."""

import math

import pytest
import torch

from engine.algorithms import torch_functional as F

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # selects 1, 2, 4


def test_masked_sum_and_mean_on_2x3():
    assert F.masked_sum(VALUES, MASK).item() == pytest.approx(7.0)
    assert F.masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(F.masked_mean(VALUES, MASK, axis=-1), torch.tensor([1.5, 4.0]))


def test_masked_token_never_contributes_even_when_nan():
    poisoned = VALUES.clone()
    poisoned[MASK == 0] = float("nan")
    assert F.masked_sum(poisoned, MASK).item() == pytest.approx(7.0)
    assert F.masked_mean(poisoned, MASK).item() == pytest.approx(7 / 3)


def test_masked_mean_of_empty_mask_is_zero():
    assert F.masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


def test_masked_var_unbiased_and_biased():
    # 1, 2, 4: mean 7/3, squared deviations sum to 42/9.
    assert F.masked_var(VALUES, MASK).item() == pytest.approx(42 / 9 / 2)
    assert F.masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(42 / 9 / 3)


def test_masked_var_rejects_empty_and_single_token_masks():
    with pytest.raises(ValueError, match="mask is empty"):
        F.masked_var(VALUES, torch.zeros_like(MASK))
    one = torch.zeros_like(MASK)
    one[0, 0] = 1
    with pytest.raises(ValueError, match="divides by zero"):
        F.masked_var(VALUES, one)


def test_masked_whiten_centres_and_scales_over_valid_tokens():
    whitened = F.masked_whiten(VALUES, MASK)
    assert whitened[0, 0].item() == pytest.approx((1 - 7 / 3) / math.sqrt(7 / 3))
    assert F.masked_mean(whitened, MASK).item() == pytest.approx(0.0, abs=1e-6)
    assert F.masked_var(whitened, MASK).item() == pytest.approx(1.0, abs=1e-6)
    kept_mean = F.masked_whiten(VALUES, MASK, shift_mean=False)
    assert F.masked_mean(kept_mean, MASK).item() == pytest.approx(7 / 3)


def test_clip_by_value_with_tensor_bounds():
    low, high = torch.tensor([0.0, 2.0, 4.0]), torch.tensor([1.0, 3.0, 5.0])
    out = F.clip_by_value(torch.tensor([-1.0, 2.5, 9.0]), low, high)
    torch.testing.assert_close(out, torch.tensor([0.0, 2.5, 5.0]))


def test_check_same_shape_names_both_shapes():
    with pytest.raises(ValueError, match=r"a has shape \(2, 3\), b has shape \(2, 4\)"):
        F.check_same_shape(a=torch.zeros(2, 3), b=torch.zeros(2, 4))


def test_logprobs_from_logits_hand_values():
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3)], [math.log(3), 0.0], [0.0, 0.0]]])
    labels = torch.tensor([[1, 1, 0]])
    expected = torch.tensor([[math.log(0.75), math.log(0.25), math.log(0.5)]])
    torch.testing.assert_close(F.logprobs_from_logits(logits, labels), expected)


def _reference_logprobs(logits, labels):
    return torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("chunk_elements", [1 << 24, 7])  # one chunk; a chunk of one row
def test_logprobs_and_entropy_match_log_softmax_on_chunks_and_slices(monkeypatch, chunk_elements):
    monkeypatch.setattr(F, "_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(0)
    full = torch.randn(3, 6, 5, dtype=torch.float64)
    logits = full[:, 1:5]  # a non-contiguous slice, as actors take the response part
    labels = torch.randint(0, 5, (3, 4))
    torch.testing.assert_close(
        F.logprobs_from_logits(logits, labels), _reference_logprobs(logits, labels)
    )
    flat = F.logprobs_from_logits(logits.reshape(-1, 5), labels.reshape(-1))  # packed (nnz, V)
    torch.testing.assert_close(flat, _reference_logprobs(logits, labels).reshape(-1))
    log_p = torch.log_softmax(logits, -1)
    torch.testing.assert_close(F.entropy_from_logits(logits), -(log_p.exp() * log_p).sum(-1))


def test_logprobs_gradient_matches_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 4, requires_grad=True)
    labels = torch.randint(0, 4, (2, 3))
    F.logprobs_from_logits(logits, labels).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    _reference_logprobs(logits, labels).sum().backward()
    torch.testing.assert_close(ours, logits.grad)


def test_logprobs_in_bfloat16_stays_close_to_fp32():
    torch.manual_seed(2)
    logits = torch.randn(2, 3, 11)
    labels = torch.randint(0, 11, (2, 3))
    half = F.logprobs_from_logits(logits.bfloat16(), labels)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), _reference_logprobs(logits, labels), atol=3e-2, rtol=0)


def test_entropy_hand_values():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    torch.testing.assert_close(
        F.entropy_from_logits(logits), torch.tensor([[math.log(4), 0.0]]), atol=1e-6, rtol=0
    )


def test_logprobs_rejects_mismatched_labels():
    with pytest.raises(
        ValueError, match=r"logits has shape \(2, 3, 5\) and labels has shape \(2, 4\)"
    ):
        F.logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_mask_span_end_is_one_past_the_last_valid_token():
    from engine.algorithms.torch_functional import mask_span_end

    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert mask_span_end(mask).tolist() == [2, 3, 0, 4]


def _backward_nodes(output: torch.Tensor, source: torch.Tensor) -> set[str]:
    """Return the names of the autograd nodes between ``output`` and ``source``."""
    seen, stack, names = set(), [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen or node is source.grad_fn:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("contiguous", [True, False])
def test_chunked_log_probs_and_their_gradient_equal_the_whole_computation(monkeypatch, contiguous):
    # A 151k-token vocabulary is cut into ~110-row chunks. Each chunk must be a split/unbind
    # view: an indexed slice's backward fills and adds a gradient the size of all the logits,
    # once per chunk (quadratic; half of a 0.5B model's update on an H200).
    monkeypatch.setattr(F, "_CHUNK_ELEMENTS", 1 << 11)  # 4 rows of 500 per chunk
    leaf = torch.randn(3, 12, 500, dtype=torch.float64, requires_grad=True)
    logits = leaf if contiguous else leaf[:, 1:-1]  # the actor's shifted view is not contiguous
    labels = torch.randint(0, 500, logits.shape[:-1], generator=torch.Generator().manual_seed(0))
    weights = torch.rand(labels.shape, dtype=torch.float64)
    got = F.logprobs_from_logits(logits, labels)
    names = _backward_nodes(got, logits)
    assert not {"SliceBackward0", "SelectBackward0"} & names, names
    expected = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), leaf)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), leaf)
    torch.testing.assert_close(grad_got, grad_expected, rtol=0, atol=1e-12)
    entropy = F.entropy_from_logits(logits)
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1), rtol=0, atol=1e-12)
