"""A spec's results scored into verdicts, and the verdict table: one row per paper claim the zoo ships.

A comparison of per-seed values is the probability of improvement of the treatment over the control with its
percentile-bootstrap 95% CI and a two-sided Mann-Whitney U ("Deep Reinforcement Learning at the Edge of the
Statistical Precipice", Agarwal et al., 2021; algorithms.experiment.stats). Its verdict:
- reproduced: the CI excludes 0.5 (no effect) on the paper's side and Mann-Whitney's p < 0.05;
- reversed: the same on the other side;
- not reproduced: otherwise (no effect cannot be ruled out at these seeds).
The p of the verdict is exact (a permutation distribution of U) where a method has at most 8 seeds: there the percentile
bootstrap's CI collapses (3 seeds against 3 give [1.00, 1.00] when every pair agrees, yet no ordering of 3 against 3 has
p below 0.1), and the normal approximation would pass p = 0.0495.
Where the results keep only an estimate with its CI (the replay reference), the two CIs are compared: apart on the
paper's side is reproduced, apart on the other side reversed, overlapping not reproduced.
A claim tested by several comparisons is reproduced when all are, partly when some are, and untested when no
experiment holds results for it. Results made under another version of their spec are kept apart: they decide nothing;
so does a comparison at too few seeds for any outcome to reach p < 0.05 (`smallest_p`), which the tables mark.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scipy import stats

from algorithms.common.errors import VcbmGymError
from algorithms.experiment import archive, measures, specs
from algorithms.experiment.stats import describe, improvement_estimate, mann_whitney

VERDICTS = ("reproduced", "partly", "not reproduced", "reversed", "untested")
Z = 1.959963984540054  # the two-sided 95% normal quantile


def detectable_effect(n_treatment: int, n_control: int) -> float:
    """Half the width of the 95% interval of the probability of improvement under no effect, at these seeds:
    its variance is (n1 + n2 + 1) / (12 n1 n2) (that of Mann-Whitney's U over n1 n2), so a true P(improvement)
    closer to 0.5 than this cannot be told from no effect."""
    return Z * math.sqrt((n_treatment + n_control + 1) / (12.0 * n_treatment * n_control))


def results_path(spec: specs.ExperimentSpec, override: Path | None = None) -> Path | None:
    if override is not None:
        return override
    if spec.results is None:
        return None
    inside = spec.path.parent == specs.SPEC_DIR
    return (specs.REPO if inside else spec.path.parent) / spec.results


def load_results(spec: specs.ExperimentSpec, path: Path) -> dict[str, Any]:
    """The results document of a results directory (its `results_file`, results.json by default) or file."""
    target = path / spec.run.get("results_file", "results.json") if path.is_dir() else path
    if not target.is_file():
        raise VcbmGymError(f"experiment {spec.name}: no results at {str(target)!r}; expected a run of the experiment there")
    try:
        return json.loads(target.read_text())
    except (OSError, ValueError) as exc:
        raise VcbmGymError(f"experiment {spec.name}: {str(target)!r} is not a results file ({type(exc).__name__})") from None


SMALL_SAMPLE = 8  # seeds per method up to which the verdict's p is exact
ALPHA = 0.05


def verdict_p(x: list[float], y: list[float]) -> float:
    """Two-sided Mann-Whitney p: by permutation for small samples (exact where there are at most 20,000 arrangements;
    ties included), else asymptotic."""
    if min(len(x), len(y)) <= SMALL_SAMPLE:
        method: Any = stats.PermutationMethod(n_resamples=20_000, rng=0)
    else:
        method = "asymptotic"
    p = stats.mannwhitneyu(x, y, alternative="two-sided", method=method).pvalue
    return 1.0 if math.isnan(p) else float(p)


def smallest_p(n_treatment: int, n_control: int) -> float:
    """The smallest p `verdict_p` can give at these seeds: that of two samples apart with no ties. Where it is not
    below ALPHA (3 seeds against 3: 2 / C(6, 3) = 0.1), no outcome can reproduce or reverse a claim."""
    return verdict_p([float(i) for i in range(n_control, n_control + n_treatment)], [float(i) for i in range(n_control)])


def can_decide(result: dict[str, Any]) -> bool:
    """Whether a scored comparison had the seeds to reach a verdict at all (estimate comparisons always can)."""
    return result.get("decidable", True)


def _compare_values(x: list[float], y: list[float], higher_is_better: bool) -> dict[str, Any]:
    improvement = improvement_estimate(x, y, lower_is_better=not higher_is_better)
    low, high, p = improvement["ci_low"], improvement["ci_high"], verdict_p(x, y)
    if low is not None and low > 0.5 and p < ALPHA:
        verdict = "reproduced"
    elif high is not None and high < 0.5 and p < ALPHA:
        verdict = "reversed"
    else:
        verdict = "not reproduced"
    return {
        "n": [len(x), len(y)],
        "treatment": describe(x),
        "control": describe(y),
        "probability_of_improvement": improvement,
        "mann_whitney": mann_whitney(x, y),
        "verdict_p": p,
        "detectable_effect": detectable_effect(len(x), len(y)),
        "decidable": len(x) > 0 and len(y) > 0 and smallest_p(len(x), len(y)) < ALPHA,
        "verdict": verdict,
    }


def _compare_estimates(x: measures.Estimate, y: measures.Estimate, higher_is_better: bool) -> dict[str, Any]:
    sign = 1.0 if higher_is_better else -1.0
    if None in (x.ci_low, x.ci_high, y.ci_low, y.ci_high):
        verdict = "not reproduced"
    elif (x.ci_low > y.ci_high) if sign > 0 else (x.ci_high < y.ci_low):
        verdict = "reproduced"
    elif (x.ci_high < y.ci_low) if sign > 0 else (x.ci_low > y.ci_high):
        verdict = "reversed"
    else:
        verdict = "not reproduced"
    return {"treatment_estimate": vars(x), "control_estimate": vars(y), "verdict": verdict}


def found_results(spec: specs.ExperimentSpec, path: Path | None = None) -> Path | None:
    """Where the spec's results are (the committed ones unless `path` names others), or None where there are none."""
    where = results_path(spec, path)
    if where is None or not where.exists():
        return None
    if where.is_dir() and not (where / spec.run.get("results_file", "results.json")).is_file():
        return None
    return where


def status(spec: specs.ExperimentSpec) -> str:
    """The committed results' registration status (specs.registration), without scoring them."""
    where = found_results(spec)
    if where is None:
        return "no results" if archive.archived_runs(spec) is None else "in progress"
    return specs.registration(spec, where)["status"]


def score(spec: specs.ExperimentSpec, path: Path | None = None) -> dict[str, Any]:
    """Every comparison of the spec scored on its results (the committed ones unless `path` names others)."""
    where = found_results(spec, path)
    if where is None:
        return {"experiment": spec.name, "status": "no results", "comparisons": []}
    record = specs.registration(spec, where)
    document = load_results(spec, where)
    measure = measures.MEASURES[spec.measure["name"]]
    scored = []
    for comparison in spec.comparisons:
        x = measures.read(spec.measure, document, comparison.treatment, comparison.setting)
        y = measures.read(spec.measure, document, comparison.control, comparison.setting)
        if isinstance(x, measures.Estimate) != isinstance(y, measures.Estimate):
            raise VcbmGymError(f"experiment {spec.name}: {comparison}: expected both methods' values of one kind")
        if isinstance(x, measures.Estimate):
            result = _compare_estimates(x, y, measure.higher_is_better)
        else:
            result = _compare_values(x, y, measure.higher_is_better)
        if record["status"] == "changed":
            result["verdict"] = "untested"  # made under another spec: kept apart, decides nothing
        scored.append(
            {"comparison": vars(comparison), "registered_before_first_run": record["registered_before_first_run"], **result}
        )
    return {"experiment": spec.name, "status": record["status"], "registration": record, "comparisons": scored}


def claim_verdict(verdicts: list[str]) -> str:
    decided = [v for v in verdicts if v != "untested"]
    if not decided:
        return "untested"
    if all(v == "reproduced" for v in decided):
        return "reproduced"
    if any(v == "reproduced" for v in decided):
        return "partly"
    return "reversed" if all(v == "reversed" for v in decided) else "not reproduced"


def effect_text(result: dict[str, Any]) -> str:
    if "probability_of_improvement" in result:
        p = result["probability_of_improvement"]
        ci = f" [{p['ci_low']:.2f}, {p['ci_high']:.2f}]" if p["ci_low"] is not None else " [no CI: < 2 seeds]"
        return f"P = {p['estimate']:.2f}{ci}"
    t, c = result["treatment_estimate"], result["control_estimate"]

    def one(e: dict[str, Any]) -> str:
        return f"{e['estimate']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"

    return f"{one(t)} vs {one(c)}"


def _seeds_text(result: dict[str, Any]) -> str:
    if "n" not in result:
        return "per episode"
    seeds = f"{result['n'][0]} vs {result['n'][1]}"
    return seeds if can_decide(result) else f"{seeds} (too few to decide)"


def verdict_rows(
    all_specs: list[specs.ExperimentSpec], scores: dict[str, dict[str, Any]], claims: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per claim of claims.yml, with every comparison that tests it."""
    tests: dict[str, list[tuple[specs.ExperimentSpec, dict[str, Any]]]] = {claim: [] for claim in claims}
    for spec in all_specs:
        for result in scores[spec.name]["comparisons"]:
            claim = result["comparison"]["claim"]
            if claim not in tests:
                raise VcbmGymError(
                    f"experiment {spec.name}: claim {claim!r} is not in {specs.CLAIMS_FILE.name}; expected a listed claim"
                )
            tests[claim].append((spec, result))
    rows = []
    for claim_id, claim in claims.items():
        found = tests[claim_id]
        # a comparison with too few seeds to decide decides nothing, like one made under another spec
        verdicts = [r["verdict"] if can_decide(r) else "untested" for _, r in found]
        rows.append({"claim_id": claim_id, **claim, "tests": found, "verdict": claim_verdict(verdicts)})
    return rows


def verdict_table(rows: list[dict[str, Any]], headline_only: bool = False) -> str:
    """The verdict table in Markdown (`headline_only`: the claims some experiment tested)."""
    lines = [
        "| Paper | Claim | Rule / objective | Task | Measured effect (95% CI) | Seeds | Budget: ours / paper | Spec first "
        "| Verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if headline_only and not row["tests"]:
            continue
        names = ", ".join(f"`{n}`" for n in row["names"])
        if not row["tests"]:
            lines.append(f"| {row['paper']} | {row['claim']} | {names} | — | — | — | — | — | **untested** |")
            continue
        tasks, effects, seeds, budgets, registered = [], [], [], [], []
        for spec, result in row["tests"]:
            c = result["comparison"]
            where = f" ({c['setting']})" if c["setting"] else ""
            tasks.append(f"[{spec.name}](#{spec.name}){where}: {c['treatment']} vs {c['control']}")
            effects.append(effect_text(result))
            seeds.append(_seeds_text(result))
            budgets.append(f"{spec.budget['ours']} / {spec.budget['paper']}")
            registered.append("yes" if result.get("registered_before_first_run") else "no")
        cells = ["<br>".join(v) for v in (tasks, effects, seeds, list(dict.fromkeys(budgets)), registered)]
        lines.append(f"| {row['paper']} | {row['claim']} | {names} | " + " | ".join(cells) + f" | **{row['verdict']}** |")
    return "\n".join(lines) + "\n"


def headline_table(rows: list[dict[str, Any]]) -> str:
    """The README's rows: every tested claim with its verdict and how many of its comparisons reproduce it."""
    lines = ["| Paper | Claim | Rule / objective | Verdict | Comparisons reproduced |", "|---|---|---|---|---|"]
    for row in rows:
        if not row["tests"]:
            continue
        verdicts = [result["verdict"] for _, result in row["tests"]]
        names = ", ".join(f"`{n}`" for n in row["names"])
        count = f"{verdicts.count('reproduced')} of {len(verdicts)}"
        undecidable = sum(not can_decide(result) for _, result in row["tests"])
        if undecidable:
            count += f" ({undecidable} with too few seeds to decide)"
        lines.append(f"| {row['paper']} | {row['claim']} | {names} | **{row['verdict']}** | {count} |")
    untested = [f"{row['claim']} ({', '.join(f'`{n}`' for n in row['names'])})" for row in rows if not row["tests"]]
    untested_line = f"\n\nUntested so far: {'; '.join(untested)}." if untested else ""
    return "\n".join(lines) + untested_line + "\n"


VERDICT_LEGEND = (
    "Effect: the probability that a run of the treatment beats a run of the control (0.5: no effect), with its "
    "percentile-bootstrap 95% CI over seeds; where only per-episode estimates exist, the two estimates with their CIs. "
    "**reproduced**: the CI excludes no effect on the paper's side and Mann-Whitney's p < 0.05 (exact at up to 8 seeds); "
    "**reversed**: the same on the other side; **not reproduced**: no effect cannot be ruled out at these seeds; "
    "'Too few to decide': no outcome at these seeds reaches p < 0.05 (3 seeds against 3: at best p = 0.1), so the "
    "comparison's 'not reproduced' says nothing either way. "
    "**partly**: some of the claim's comparisons reproduce; **untested**: no experiment of the zoo measures the claim "
    "yet. 'Spec first': whether the experiment's spec was committed before its results were made (no: the results "
    "predate the spec, which was written from them)."
)


def tuning_text(tuning: dict[str, Any]) -> str:
    """How the settings were chosen: `tuning.by`, then its seeds where it does not already name them."""
    if "seeds" not in tuning:
        return tuning["by"]
    seeds = f"seeds {tuning['seeds']['start']}-{tuning['seeds']['start'] + tuning['seeds']['n'] - 1}"
    return tuning["by"] if seeds in tuning["by"] else f"{tuning['by']} ({seeds})"


def spec_markdown(spec: specs.ExperimentSpec, scored: dict[str, Any]) -> str:
    """One experiment's section: the claim, its settings as data, its registration and its comparisons."""
    measure = measures.MEASURES[spec.measure["name"]]
    tuning = "none" if spec.tuning is None else tuning_text(spec.tuning)
    status = scored["status"]
    registration = {
        "registered": "yes: made under this spec, committed before the run",
        "unregistered": "made under this spec, which was not committed at the time",
        "changed": "no: the spec changed after these results were made; they are kept apart and decide nothing",
        "deviating": "made with overrides of the spec (exploratory): "
        + json.dumps(scored.get("registration", {}).get("record", {}).get("deviations", {})),
        "predates-spec": "no: these results predate the spec, which was written from the command that made them",
        "no results": "no results yet",
    }[status]
    archived = archive.archived_runs(spec) if status == "no results" else None
    if archived is not None:
        total = specs.planned_runs(spec)
        heading_for = "" if total is None else f" of {total}"
        registration += f" (in progress: {archived}{heading_for} runs archived)"
    rows = [
        ("spec", f"`zoo_configs/experiments/{spec.path.name}` (hash `{spec.hash[:12]}`)"),
        ("kind", spec.kind),
        ("seeds", f"{spec.seeds.start}-{spec.seeds.stop - 1} ({len(spec.seeds)})"),
        ("settings chosen by", tuning),
        ("budget (ours / paper)", f"{spec.budget['ours']} / {spec.budget['paper']}"),
        ("measure", f"`{spec.measure['name']}`: {measure.description}"),
        ("spec committed before the results", registration),
    ]
    table = "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"
    lines = [
        "| Comparison | Setting | Effect (95% CI) | p (Mann-Whitney) | Seeds | Detectable at these seeds | Verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in scored["comparisons"]:
        c = result["comparison"]
        p = result.get("verdict_p")
        detectable = f"±{result['detectable_effect']:.2f}" if "detectable_effect" in result else "—"
        if not can_decide(result):
            detectable = f"nothing: p >= {smallest_p(*result['n']):.2g} whatever the outcome"
        lines.append(
            f"| {c['treatment']} vs {c['control']} (`{c['claim']}`) | {c['setting'] or '—'} | {effect_text(result)} | "
            f"{'—' if p is None else f'{p:.3g}'} | {_seeds_text(result)} | {detectable} | {result['verdict']} |"
        )
    if not spec.comparisons:
        comparisons = "No comparison: the spec describes its methods.\n"
    else:
        comparisons = "\n".join(lines) + "\n" if scored["comparisons"] else "No results yet.\n"
    notes = f"\n{spec.notes.strip()}\n" if spec.notes else ""
    return f"{table}\n{comparisons}{notes}"
