"""The LLM arm's memory bounds: sampled-token log-probs in rollouts, the episode token bound, the
start-up memory line, and vLLM generation with unequal context counts per process."""

import threading

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

import vcbm_gym  # noqa: E402, F401
from algorithms.llm.rollout import hf_generate  # noqa: E402
from algorithms.llm.tiny import build_tiny  # noqa: E402


def full_vocab_generate(model, tokenizer, contexts, max_new_tokens, temperature):
    """The earlier hf_generate: `output_scores=True` and a stacked [batch, steps, vocab] log_softmax."""
    pad = tokenizer.pad_token_id
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        input_ids[i, width - len(c) :] = torch.tensor(c)
        attention[i, width - len(c) :] = 1
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
    new = out.sequences[:, width:]
    logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
    results = []
    for i in range(len(contexts)):
        ids, lps = [], []
        for j, tok in enumerate(new[i].tolist()):
            ids.append(tok)
            lps.append(float(logps[i, j, tok]))
            if tok == tokenizer.eos_token_id:
                break
        results.append((ids, lps))
    return results


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_token_logprobs_equal_the_full_vocabulary_log_softmax(temperature):
    model, tokenizer = build_tiny(0)
    texts = ["Thought: repair the watch", "Action: inspect()", "Observation: the watch has stopped . Turn 1 of 3"]
    contexts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    for seed in range(3):
        torch.manual_seed(seed)
        new = hf_generate(model, tokenizer, contexts, 24, temperature)
        torch.manual_seed(seed)
        old = full_vocab_generate(model, tokenizer, contexts, 24, temperature)
        assert [ids for ids, _ in new] == [ids for ids, _ in old]  # the same samples
        assert [lps for _, lps in new] == [lps for _, lps in old]  # bit for bit
        assert all(len(ids) == len(lps) > 0 for ids, lps in new)
