"""The markdown table of one env's result: per rule, fidelity to the replay reference and leakage with their CIs."""

from __future__ import annotations

from typing import Any

from algorithms.credit_reference.replay import ACTIONS, SLOTS
from algorithms.credit_reference.scoring import METRICS

TABLE_HEAD = [
    "| Rule | Sign all | Sign nz | Spearman | Top step | Median cosine | Leakage | Seconds per seed |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]


def markdown_table(result: dict[str, Any]) -> str:
    """One row per rule: fidelity to the replay reference and leakage, estimates with 95% bootstrap CIs (on a set
    action a second table: both centred within the set)."""
    s = result["settings"]
    groups = f", loo/grpo groups of {s['group_size']} rollouts per task" if s.get("group_size", 1) > 1 else ""
    if s.get("branching") == SLOTS:
        lines = [
            f"Replay-reference fidelity on {result['env']} per slot of the set action: behaviour policy {s['policy']} "
            f"(each slot uniform over the pool), {s['seeds']} seeds x {s['episodes']} scored sets{groups}; reference credit of "
            "slot i = v(a) - E_b v(a with slot i := b) over every pool item b, v the env's exact expected value "
            "(deterministic: one evaluation per alternative, no continuations); rules' credit from the snapshot "
            "evaluator; mean over sets (cosine: median), 95% bootstrap CI.",
            f"Share of slots with non-zero reference credit: {result['reference']['share_nonzero']:.3f}. "
            "Uncentred (as defined); the second table centres credit and reference within each set (CASI's protocol).",
        ]
    else:
        leak = result["reference"]["leakage"]
        per = "action" if s.get("branching", ACTIONS) == ACTIONS else "alternative"
        lines = [
            f"Replay-reference fidelity on {result['env']}: behaviour policy {s['policy']}, {s['seeds']} seeds x "
            f"{s['episodes']} scored episodes, K = {s['k']} continuations per {per} and step "
            f"({'common random numbers' if s['common_random_numbers'] else 'independent branches'}), rules trained on "
            f"{s['train_episodes']} episodes per seed{groups}; mean over episodes (cosine: median), 95% bootstrap CI.",
            f"The reference's mean standard error per step: {result['reference']['mean_credit_se']:.3g}; its own leakage: "
            + ("n/a (no decision step)" if not leak or leak["estimate"] is None else f"{leak['estimate']:.3f}")
            + _decision_precision(result["reference"].get("mean_abs_z_at_decision"))
            + ".",
        ]
    lines += ["", *TABLE_HEAD, *table_rows(result["rules"], "summary")]
    if s.get("branching") == SLOTS:
        lines += ["", "Centred within the set:", "", *TABLE_HEAD, *table_rows(result["rules"], "summary_centred")]
    return "\n".join(lines)


def _decision_precision(mean_abs_z: float | None) -> str:
    """How far the reference's credit at the decision stands from 0 in its own standard errors (none where every
    decision's SE is 0: then the reference is exact there)."""
    return "" if mean_abs_z is None else f"; its mean |credit / SE| at the decision: {mean_abs_z:.2f}"


def table_rows(rules: dict[str, Any], summary: str) -> list[str]:
    lines = []
    for name, row in rules.items():
        if "refused" in row:
            lines.append(f"| `{name}` | refused: {row['refused'].replace('|', '/')} | | | | | | |")  # no cell break
            continue
        cells = [_cell(row[summary][metric]) for metric in METRICS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {row['seconds_per_seed']:.1f} |")
    return lines


def _cell(estimate: dict[str, Any]) -> str:
    if estimate["estimate"] is None:
        return "n/a"
    if estimate["ci_low"] is None:
        return f"{estimate['estimate']:.3f}"
    return f"{estimate['estimate']:.3f} [{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}]"
