"""Peak memory of the rollout log-prob path: the earlier full-vocabulary stacking against sampled tokens only.

`before` is the earlier `hf_generate` (kept here as the reference): `output_scores=True` keeps one
[episodes, vocab] score tensor per generated step, then a log_softmax of each is stacked into
[episodes, steps, vocab]. `after` is `algorithms.llm.generation.rollout.hf_generate`, which gathers the sampled
token's log-prob from one step's log_softmax at a time. Both run the tiny random Qwen2 of
algorithms.llm.model.tiny with a large synthetic vocabulary (default 152,000, Qwen2.5's order), the same
contexts and the same seed, each in its own subprocess; the peak resident set size
(resource.getrusage maxrss) is printed side by side with the ratio, together with the peak above
the process's size just before generating and whether both produced the same tokens and log-probs.

    python benchmarks/llm_logprob_memory.py [--vocab 152000] [--episodes 8] [--steps 256]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def full_vocab_generate(model, tokenizer, contexts, max_new_tokens, temperature):
    """The earlier hf_generate: `output_scores=True` and a stacked [episodes, steps, vocab] log_softmax."""
    import torch

    from algorithms.llm.generation.rollout import answers_until_eos, left_padded

    pad = tokenizer.pad_token_id
    input_ids, attention = left_padded(contexts, pad)
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
    new = out.sequences[:, input_ids.shape[1] :]
    logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
    return answers_until_eos(new, logps.gather(-1, new.unsqueeze(-1)).squeeze(-1), tokenizer.eos_token_id)


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kibibytes


def measure(method: str, vocab: int, episodes: int, steps: int, temperature: float) -> dict:
    """One method in this process: peak RSS, the RSS peak before generating, a digest of the answers."""
    import torch

    sys.path.insert(0, str(REPO))
    from algorithms.llm.generation.rollout import hf_generate
    from algorithms.llm.model.tiny import build_tiny_model

    torch.set_num_threads(1)
    model = build_tiny_model(vocab_size=vocab)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=vocab - 1)
    generator = torch.Generator().manual_seed(0)
    contexts = [torch.randint(1, vocab - 1, (16 + 4 * i,), generator=generator).tolist() for i in range(episodes)]
    with torch.no_grad():  # warm-up: allocator and kernels, so that `before` holds everything but the steps
        model.generate(
            input_ids=torch.tensor([contexts[0]]),
            max_new_tokens=2,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=vocab - 1,
        )
    before = maxrss_bytes()
    torch.manual_seed(1)
    generate = full_vocab_generate if method == "before" else hf_generate
    answers = generate(model, tokenizer, contexts, steps, temperature)
    peak = maxrss_bytes()
    digest = hashlib.sha256(json.dumps(answers).encode()).hexdigest()[:16]
    return {"method": method, "peak": peak, "before": before, "tokens": sum(len(a[0]) for a in answers), "digest": digest}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=152_000)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=256, help="generated tokens per episode (max_new_tokens)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--method", choices=("before", "after"), help=argparse.SUPPRESS)  # the subprocess's
    args = parser.parse_args(argv)
    if args.method:
        print(json.dumps(measure(args.method, args.vocab, args.episodes, args.steps, args.temperature)))
        return
    rows = {}
    for method in ("before", "after"):
        cmd = [sys.executable, __file__, "--method", method]
        cmd += ["--vocab", str(args.vocab), "--episodes", str(args.episodes), "--steps", str(args.steps)]
        cmd += ["--temperature", str(args.temperature)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows[method] = json.loads(out.strip().splitlines()[-1])
    mib = 2**20
    b, a = rows["before"], rows["after"]
    full = args.episodes * args.steps * args.vocab * 4
    print(
        f"vocab {args.vocab:,}, {args.episodes} episodes x {args.steps} steps, temperature {args.temperature}, tiny Qwen2 "
        f"(one [episodes, steps, vocab] fp32 tensor: {full / mib:,.0f} MiB)"
    )
    print(f"{'':28}{'before (full log_softmax)':>28}{'after (sampled tokens)':>26}{'ratio':>9}")
    print(f"{'peak RSS (MiB)':28}{b['peak'] / mib:>28,.0f}{a['peak'] / mib:>26,.0f}{b['peak'] / a['peak']:>9.1f}")
    grow_b, grow_a = b["peak"] - b["before"], a["peak"] - a["before"]
    ratio = f"{grow_b / grow_a:>9.1f}" if grow_a >= mib else f"{'n/a':>9}"  # under 1 MiB: within the build's peak
    print(f"{'peak above pre-generate (MiB)':28}{grow_b / mib:>28,.0f}{grow_a / mib:>26,.0f}{ratio}")
    same = b["digest"] == a["digest"] and b["tokens"] == a["tokens"]
    print(f"same tokens and log-probs: {'yes' if same else 'NO'} ({b['tokens']} tokens)")


if __name__ == "__main__":
    main()
