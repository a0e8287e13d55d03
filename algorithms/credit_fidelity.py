"""Credit fidelity of set-level credit rules against a replay Shapley reference (CASI: "CASI: Credit Assignment via Set
Intervention for Agentic Retrieval", docs/papers/casi.md).

    python -m algorithms.credit_fidelity --env SetRetrieval-v0 --requests 1000 --out DIR [--seed S]
    python -m algorithms.credit_fidelity --env SetRetrieval-v0 --train --out DIR

Fidelity (the paper's Tables 2 and 6): for each request the env draws, a behaviour policy submits
m distinct pool items uniformly at random; every rule's credit is computed from the snapshot
(training-time, noisy) evaluator's 2^m coalition values, centred within the set, and compared
with the reference credit = centred exact Shapley of the exact expected values. Metrics per
request: sign agreement over all actions and over actions with non-zero reference credit,
Spearman's rho, whether the rule's top action is a reference top action, and cosine. Broadcast
has zero centred credit, so none of these is defined for it and it is left out. Median cosine is
the primary metric, with a request-level paired bootstrap 95% CI (percentile, scipy.stats.bootstrap)
of CASI (Shapley) minus each rule.

Training (--train, the paper's Table 3 analogue): see `train_comparison`.
Writes DIR/fidelity.json + DIR/fidelity.md (and DIR/training.json + DIR/training.md with --train).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import gymnasium as gym
import numpy as np
from scipy import stats

import vcbm_gym  # noqa: F401  (registers the envs)
from algorithms.common import cli, provenance
from algorithms.common.errors import ConfigError
from vcbm_gym.credit.set_credit import set_credit, shapley_exact, zero_sum_shaping

FIDELITY_RULES = ("shapley", "singleton", "banzhaf", "loo")
RULE_LABELS = {
    "shapley": "CASI (Shapley)",
    "singleton": "Singleton",
    "banzhaf": "Banzhaf",
    "loo": "LOO",
    "broadcast": "Broadcast",
    "casi": "CASI",
}
ZERO = 1e-12
HELDOUT_SEED_BASE = 10**9  # training requests use env seeds below this, held-out ones above


def fidelity_metrics(credit: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Per-request agreement of a centred credit vector with the centred reference."""
    sign_c = np.where(np.abs(credit) > ZERO, np.sign(credit), 0.0)
    sign_r = np.where(np.abs(reference) > ZERO, np.sign(reference), 0.0)
    nonzero = sign_r != 0
    norms = np.linalg.norm(credit) * np.linalg.norm(reference)
    constant = np.ptp(credit) <= ZERO or np.ptp(reference) <= ZERO
    top = np.flatnonzero(reference >= reference.max() - ZERO)
    return {
        "sign_all": float(np.mean(sign_c == sign_r)),
        "sign_nz": float(np.mean(sign_c[nonzero] == sign_r[nonzero])) if nonzero.any() else math.nan,
        "spearman": math.nan if constant else float(stats.spearmanr(credit, reference).statistic),
        "top_action": math.nan if np.ptp(credit) <= ZERO else float(int(np.argmax(credit)) in top),
        "cosine": float(credit @ reference / norms) if norms > ZERO else math.nan,
    }


def median_difference_ci(
    a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n_resamples: int = 2000
) -> tuple[float, float, float]:
    """median(a) - median(b) with a request-level paired percentile bootstrap 95% CI."""
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    diff = float(np.median(a) - np.median(b))
    result = stats.bootstrap(
        (a, b),
        lambda x, y, axis: np.median(x, axis=axis) - np.median(y, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=n_resamples,
        method="percentile",
        confidence_level=0.95,
        random_state=rng,
    )
    return diff, float(result.confidence_interval.low), float(result.confidence_interval.high)


def make_set_env(env_id: str, **overrides: Any) -> gym.Env:
    try:
        env = gym.make(env_id, **overrides).unwrapped
    except gym.error.Error as error:
        raise ConfigError(f"--env {env_id!r}: {error}") from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"--env {env_id!r} with {overrides}: {error}") from None
    if not hasattr(env, "request") or not hasattr(env, "params"):
        raise ConfigError(
            f"--env {env_id!r}: expected a set-action env exposing snapshot and reference evaluators, such as SetRetrieval-v0"
        )
    return env


def run_fidelity(env_id: str, n_requests: int, seed: int, **overrides: Any) -> dict[str, Any]:
    env = make_set_env(env_id, **overrides)
    rng = np.random.default_rng(seed)
    m, pool = env.params.set_size, env.params.pool_size
    per_rule: dict[str, list[dict[str, float]]] = {rule: [] for rule in FIDELITY_RULES}
    for request_index in range(n_requests):
        env.reset(seed=seed * 1_000_003 + request_index)
        slots = rng.choice(pool, size=m, replace=False)
        snapshot = env.request.slot_coalition_values(slots, "snapshot")
        reference = shapley_exact(env.request.slot_coalition_values(slots, "reference"))
        reference = reference - reference.mean()
        for rule in FIDELITY_RULES:
            credit = set_credit(rule, snapshot)
            per_rule[rule].append(fidelity_metrics(credit - credit.mean(), reference))
    table = {}
    cosines = {rule: np.array([row["cosine"] for row in rows]) for rule, rows in per_rule.items()}
    for rule, rows in per_rule.items():
        entry = {key: float(np.nanmean([row[key] for row in rows])) for key in rows[0]}
        entry["median_cosine"] = float(np.nanmedian(cosines[rule]))
        entry["n_defined_cosine"] = int(np.sum(~np.isnan(cosines[rule])))
        if rule != "shapley":
            diff, low, high = median_difference_ci(cosines["shapley"], cosines[rule], rng)
            entry["casi_minus_rule"] = {"median_cosine_diff": diff, "ci95": [low, high]}
        table[rule] = entry
    return {
        "env": env_id,
        "requests": n_requests,
        "seed": seed,
        "set_size": m,
        "pool_size": pool,
        "env_params": {k: v for k, v in vars(env.params).items()},
        "behaviour_policy": "uniform random m of P",
        "broadcast": "excluded: centred Broadcast credit is 0, so cosine/Spearman/top action are undefined",
        "rules": table,
    }


def fidelity_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Credit fidelity on {result['env']}: {result['requests']} requests, seed {result['seed']}, "
        f"m = {result['set_size']} of P = {result['pool_size']}; reference = exact Shapley of exact values.",
        f"Snapshot evaluator: eval_noise_sd = {result['env_params']['eval_noise_sd']}, eval_bias_sd = "
        f"{result['env_params']['eval_bias_sd']}; behaviour policy: {result['behaviour_policy']}.",
        "",
        "| Rule | Sign all | Sign nz | Spearman | Top action | Median cosine | CASI - rule (95% CI) |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule, row in result["rules"].items():
        gap = row.get("casi_minus_rule")
        gap_text = "—" if gap is None else (f"{gap['median_cosine_diff']:+.4f} [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}]")
        lines.append(
            f"| {RULE_LABELS[rule]} | {row['sign_all']:.4f} | {row['sign_nz']:.4f} | {row['spearman']:.4f} "
            f"| {row['top_action']:.4f} | {row['median_cosine']:.4f} | {gap_text} |"
        )
    lines.append("")
    lines.append(f"Broadcast: {result['broadcast']}.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Policy training comparison (Table 3 analogue)
# ----------------------------------------------------------------------------------------------


def pick_features(features: np.ndarray, n_facets: int, chosen: list[int]) -> np.ndarray:
    """(P, 2 + T + T^2) inputs of the autoregressive linear policy for the next pick, given the
    items chosen so far (as an LLM writes its list item by item): the item's facet-weighted noisy
    coverage; the part of it not yet covered by the chosen items (a redundancy-aware gain); its
    intent one-hot; and intent(item) x intents-already-chosen indicators, through which the
    policy can learn which intents complement each other."""
    coverage, weights = features[:, :n_facets], features[:, n_facets : 2 * n_facets]
    intent = features[:, 2 * n_facets :]
    uncovered = np.prod(1.0 - coverage[chosen], axis=0) if chosen else np.ones(n_facets)
    chosen_intents = (intent[chosen].sum(axis=0) > 0).astype(float) if chosen else np.zeros(intent.shape[1])
    pairs = (intent[:, :, None] * chosen_intents[None, None, :]).reshape(len(features), -1)
    return np.hstack([(coverage @ weights[0])[:, None], ((coverage * uncovered) @ weights[0])[:, None], intent, pairs])


def rollout_policy(
    features: np.ndarray, n_facets: int, m: int, theta: np.ndarray, rng: np.random.Generator | None
) -> tuple[list[int], list[np.ndarray]]:
    """m distinct items, each drawn from softmax(x @ theta) over the items left (greedy argmax
    when rng is None); returns the items and, per pick, the score-function gradient
    d log pi(pick) / d theta = x_pick - E_pi[x]."""
    chosen, grads = [], []
    for _ in range(m):
        x = pick_features(features, n_facets, chosen)
        logits = x @ theta
        logits[chosen] = -np.inf
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        item = int(np.argmax(probs)) if rng is None else int(rng.choice(len(probs), p=probs))
        grads.append(x[item] - probs @ x)
        chosen.append(item)
    return chosen, grads


def train_policy(
    env: gym.Env,
    method: str,
    seed: int,
    iterations: int,
    requests_per_iter: int,
    rollouts: int,
    lr: float,
    beta: float,
    bound: float,
) -> np.ndarray:
    """REINFORCE on snapshot rewards: pick k of rollout g is weighted by A^(g) + beta * z_k, where
    A^(g) is the leave-one-out advantage over the request's rollouts (Broadcast: z = 0) and z the
    bounded zero-sum shaping of Singleton or Shapley (CASI) credit from the snapshot's coalition
    values of the m picks. Returns the linear policy's weights."""
    rng = np.random.default_rng(seed)
    k, m = env.params.n_facets, env.params.set_size
    theta = np.zeros(2 + env.params.n_intents * (env.params.n_intents + 1))
    for _ in range(iterations):
        grad = np.zeros_like(theta)
        for _ in range(requests_per_iter):
            env.reset(seed=int(rng.integers(HELDOUT_SEED_BASE)))  # disjoint from held-out seeds
            samples = [rollout_policy(env.request.features, k, m, theta, rng) for _ in range(rollouts)]
            tables = [env.request.slot_coalition_values(items, "snapshot") for items, _ in samples]
            returns = np.array([table[-1] for table in tables])
            baseline = (returns.sum() - returns) / (rollouts - 1)
            for (_, grads), table, advantage in zip(samples, tables, returns - baseline):
                z = np.zeros(m)
                if method != "broadcast":
                    z = zero_sum_shaping(set_credit("shapley" if method == "casi" else "singleton", table), bound)
                grad += sum((advantage + beta * z_k) * g for z_k, g in zip(z, grads))
        theta += lr * grad / (requests_per_iter * rollouts)
    return theta


def evaluate_policy(env: gym.Env, theta: np.ndarray, seeds: np.ndarray) -> float:
    """Mean reference (replay) value of the greedy set on common held-out requests."""
    values = []
    for seed in seeds:
        env.reset(seed=int(seed))
        items, _ = rollout_policy(env.request.features, env.params.n_facets, env.params.set_size, theta, None)
        values.append(env.request.reference_value(items))
    return float(np.mean(values))


def train_comparison(
    env_id: str,
    seed: int,
    n_seeds: int = 5,
    iterations: int = 60,
    requests_per_iter: int = 8,
    rollouts: int = 4,
    lr: float = 1.0,
    beta: float = 1.0,
    bound: float = 0.2,
    heldout: int = 1000,
    **overrides: Any,
) -> dict[str, Any]:
    """Broadcast vs Singleton vs CASI shaping (the paper's Table 3 analogue): `n_seeds` training
    runs each of the linear autoregressive policy (`pick_features`), then the greedy set's mean
    reference value on `heldout` common held-out requests; also a uniformly random set's value and
    the best set's (exhaustive search over the pool) for scale."""
    env = make_set_env(env_id, **overrides)
    heldout_seeds = HELDOUT_SEED_BASE + seed * 10_007 + np.arange(heldout)
    results: dict[str, Any] = {}
    for method in ("broadcast", "singleton", "casi"):
        scores = [
            evaluate_policy(
                env,
                train_policy(env, method, seed * 100 + s, iterations, requests_per_iter, rollouts, lr, beta, bound),
                heldout_seeds,
            )
            for s in range(n_seeds)
        ]
        results[method] = {"mean": float(np.mean(scores)), "std": float(np.std(scores, ddof=1)), "runs": scores}
    sets = np.array([mask for mask in range(1 << env.params.pool_size) if bin(mask).count("1") == env.params.set_size])
    random_values, best_values = [], []
    for s in heldout_seeds:
        env.reset(seed=int(s))
        random_values.append(env.request.reference_table[sets].mean())
        best_values.append(env.request.reference_table[sets].max())
    results["uniform_random"] = {"mean": float(np.mean(random_values))}
    results["best_set"] = {"mean": float(np.mean(best_values))}
    config = dict(
        n_seeds=n_seeds,
        iterations=iterations,
        requests_per_iter=requests_per_iter,
        rollouts=rollouts,
        lr=lr,
        beta=beta,
        bound=bound,
        heldout=heldout,
    )
    return {"env": env_id, "seed": seed, "config": config, "methods": results}


def training_markdown(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"Held-out mean reference set value on {c['heldout']} common requests ({result['env']}); "
        f"mean ± std over {c['n_seeds']} training runs of {c['iterations']} iterations.",
        "",
        "| Method | Mean replay value |",
        "|---|---|",
        f"| Uniform random set (expected) | {result['methods']['uniform_random']['mean']:.4f} |",
        f"| Best set (exhaustive, upper bound) | {result['methods']['best_set']['mean']:.4f} |",
    ]
    for method in ("broadcast", "singleton", "casi"):
        row = result["methods"][method]
        lines.append(f"| {RULE_LABELS[method]} | {row['mean']:.4f} ± {row['std']:.4f} |")
    return "\n".join(lines) + "\n"


MAX_REQUESTS = 10_000_000


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.credit_fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="SetRetrieval-v0")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-noise-sd", type=float, default=None, help="override the env's snapshot noise sd")
    parser.add_argument("--eval-bias-sd", type=float, default=None, help="override the env's snapshot bias sd")
    parser.add_argument("--train", action="store_true", help="also run the policy-training comparison")
    return parser


def run(argv: list[str]) -> None:
    started = provenance.start()
    args = build_parser().parse_args(argv)
    cli.check_int(args.requests, "--requests", 10, MAX_REQUESTS)
    cli.check_seed(args.seed, "--seed")
    overrides = {k: v for k, v in (("eval_noise_sd", args.eval_noise_sd), ("eval_bias_sd", args.eval_bias_sd)) if v is not None}
    make_set_env(args.env, **overrides)  # bad env or values: one line before any work
    out = cli.output_dir(args.out, "--out")
    result = run_fidelity(args.env, args.requests, args.seed, **overrides)
    cli.atomic_write_text(out / "fidelity.json", json.dumps(result, indent=2, default=list))
    markdown = fidelity_markdown(result)
    cli.atomic_write_text(out / "fidelity.md", markdown)
    print(markdown)
    if args.train:
        training = train_comparison(args.env, args.seed, **overrides)
        cli.atomic_write_text(out / "training.json", json.dumps(training, indent=2))
        markdown = training_markdown(training)
        cli.atomic_write_text(out / "training.md", markdown)
        print(markdown)
    # the command, commit and wall time behind these numbers (benchmarks/make_results.py publishes them)
    provenance.write_run_record(
        out,
        "python -m algorithms.credit_fidelity",
        argv,
        started,
        settings={"env": args.env, "requests": args.requests, "seed": args.seed, "train": args.train, **overrides},
    )


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
