"""The training pass with each distinct prompt encoded once, over chunks of rows of similar completion length cut
to their longest, gives the log-probs, entropies and gradients of the full pass over every [prompt, completion] row."""

import pytest
import torch

from algorithms.llm.model.tiny import build_tiny_model
from algorithms.llm.training.shared_prefix import (
    completion_ends,
    distinct_prompts,
    length_chunks,
    shared_prefix_logps,
    trimmed_chunk_logps,
)

PAD = 0


def _batch(generator: torch.Generator, vocab: int, groups: int, k: int):
    """Rows of `groups` distinct left-padded prompts, k rows each (interleaved, not contiguous), with
    right-padded completions of different lengths."""
    prompt_width, completion_width = 9, 7
    ids, mask = [], []
    prompts = []
    for g in range(groups):
        length = prompt_width - g  # a different left padding per prompt
        tokens = torch.randint(1, vocab, (length,), generator=generator)
        prompts.append(
            (torch.cat([torch.full((prompt_width - length,), PAD), tokens]), torch.arange(prompt_width) >= prompt_width - length)
        )
    for row in range(groups * k):
        prompt, prompt_mask = prompts[row % groups]
        length = 0 if row == 1 else 3 + row % (completion_width - 2)  # row 1: no completion at all
        completion = torch.randint(1, vocab, (completion_width,), generator=generator)
        completion_mask = torch.arange(completion_width) < length
        completion = completion.masked_fill(~completion_mask, PAD)
        ids.append(torch.cat([prompt, completion]))
        mask.append(torch.cat([prompt_mask, completion_mask]).long())
    return torch.stack(ids), torch.stack(mask), completion_width


def _full_pass(model, ids, mask, keep, temperature):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -keep - 1 : -1].float() / temperature
    log_probs = torch.log_softmax(logits, -1)
    return log_probs.gather(-1, ids[:, -keep:].unsqueeze(-1)).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)


def _model_batch_and_full_pass(temperature):
    """The tiny model, a batch of 3 prompts x 4 rows, its completions' loss weights, and the full pass's log-probs,
    entropies and gradients of the loss sum(weights x log-probs) + sum(entropies) over the completion mask."""
    torch.manual_seed(0)
    model = build_tiny_model(vocab_size=50, hidden_size=32, tie_embeddings=False, embedding_std=1.0).float()
    ids, mask, keep = _batch(torch.Generator().manual_seed(1), 50, groups=3, k=4)
    on = mask[:, -keep:].bool()
    weights = torch.randn(on.shape, generator=torch.Generator().manual_seed(2))
    ref_logps, ref_entropy = _full_pass(model, ids, mask, keep, temperature)
    ((ref_logps * weights)[on].sum() + ref_entropy[on].sum()).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return model, ids, mask, keep, weights, (ref_logps, ref_entropy, ref_grads)


def _assert_the_full_pass(model, logps, entropy, on, weights, full_pass):
    """The same loss back-propagated through `logps` and `entropy` gives the full pass's numbers and gradients."""
    ref_logps, ref_entropy, ref_grads = full_pass
    ((logps * weights)[on].sum() + entropy[on].sum()).backward()
    torch.testing.assert_close(logps[on], ref_logps[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy[on], ref_entropy[on], rtol=0, atol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_same_logps_entropies_and_gradients_as_the_full_pass(temperature):
    model, ids, mask, keep, weights, full_pass = _model_batch_and_full_pass(temperature)
    logps, entropy = shared_prefix_logps(model, ids, mask, keep, temperature, compute_entropy=True)
    _assert_the_full_pass(model, logps, entropy, mask[:, -keep:].bool(), weights, full_pass)


def test_distinct_prompts_in_order_of_first_appearance():
    ids = torch.tensor([[0, 5, 6], [1, 2, 3], [0, 5, 6], [1, 2, 3], [0, 5, 7]])
    mask = (ids != 0).long()
    first, row_prompt = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1, 4]
    assert row_prompt.tolist() == [0, 1, 0, 1, 2]


def test_a_prompt_differing_only_in_its_mask_is_its_own():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    first, row_prompt = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1] and row_prompt.tolist() == [0, 1]


def test_nothing_shared_returns_none():
    model = build_tiny_model(vocab_size=50, hidden_size=32)
    ids, mask, keep = _batch(torch.Generator().manual_seed(3), 50, groups=3, k=1)
    assert shared_prefix_logps(model, ids, mask, keep, 1.0, False) is None


@pytest.mark.parametrize("max_rows", [12, 5, 1])
def test_trimmed_chunks_give_the_full_pass_in_the_rows_order(max_rows):
    model, ids, mask, keep, weights, full_pass = _model_batch_and_full_pass(0.7)
    widths = []

    def unshared(chunk_ids, chunk_mask, chunk_keep):
        widths.append(chunk_keep)
        return _full_pass(model, chunk_ids, chunk_mask, chunk_keep, 0.7)

    logps, entropy = trimmed_chunk_logps(model, ids, mask, keep, 0.7, True, max_rows=max_rows, unshared_pass=unshared)
    assert logps.shape == entropy.shape == (ids.size(0), keep)
    assert torch.isfinite(logps).all() and torch.isfinite(entropy).all()  # cut positions come back as 0, never NaN
    _assert_the_full_pass(model, logps, entropy, mask[:, -keep:].bool(), weights, full_pass)
    if max_rows == 1:  # one row a chunk: nothing shared, every chunk cut to its own row's completion
        assert sorted(widths, reverse=True) == [
            max(int(n), 1) for n in completion_ends(mask[:, -keep:]).sort(descending=True).values
        ]


def test_completion_ends_is_one_past_the_last_attended_position():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert completion_ends(mask).tolist() == [2, 0, 3, 4]


def test_length_chunks_cut_where_padding_costs_more_than_encoding_the_prompt_again():
    # rows 10, 9, 8, 1 tokens long, one prompt: one chunk costs 4 x 10 + w, cutting off the short row 3 x 10 + 1 + 2w
    assert length_chunks([10, 9, 8, 1], [0, 0, 0, 0], prompt_width=4, max_rows=4, call_cost=0) == [(0, 3), (3, 4)]
    assert length_chunks([10, 9, 8, 1], [0, 0, 0, 0], prompt_width=40, max_rows=4, call_cost=0) == [(0, 4)]
    # a chunk's fixed cost: 44 + 10 as one chunk against 39 + 20 as two
    assert length_chunks([10, 9, 8, 1], [0, 0, 0, 0], prompt_width=4, max_rows=4, call_cost=10) == [(0, 4)]
    # at most max_rows rows a chunk
    assert length_chunks([10, 9, 8, 1], [0, 0, 0, 0], prompt_width=40, max_rows=2, call_cost=0) == [(0, 2), (2, 4)]
    # two prompts: a chunk pays for each distinct prompt it holds (20 + 20 + 4 x 10 = 80 as one chunk, 64 as two)
    assert length_chunks([10, 9, 2, 1], [0, 0, 1, 1], prompt_width=20, max_rows=4, call_cost=0) == [(0, 2), (2, 4)]
