"""An experiment as data: a registered spec file, `zoo_configs/experiments/<name>.yml`, and the claims it tests.

A spec names the paper claim(s) it tests, how its runs are made (`kind`: `compare`, `suite` or `llm` or
`script`, with that command's settings under `run`), its seeds (declared, and disjoint from the seeds that chose its settings,
`tuning.seeds`), its budget beside the paper's, the measure it scores (algorithms.experiment.measures) and the
comparisons that decide each claim. `zoo_configs/experiments/claims.yml` lists every paper claim of every rule,
objective and algo the zoo ships, tested or not.

Registration (the bsuite idea: an experiment is its settings plus a score, fixed before it runs): a spec's hash is
that of its parsed content; a run of the engine records it (OUT/experiment.json), and results made under another
hash are kept apart and never pooled. `registration` says whether a results directory was made with the spec as
committed now, and whether that spec was committed before the run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from algorithms.common.errors import VcbmGymError

REPO = Path(__file__).resolve().parents[2]
SPEC_DIR = REPO / "zoo_configs" / "experiments"
CLAIMS_FILE = SPEC_DIR / "claims.yml"
KINDS = ("compare", "suite", "llm", "script")
SPEC_KEYS = {"title", "kind", "run", "seeds", "tuning", "budget", "measure", "comparisons", "results", "notes", "claims"}
CLAIM_KEYS = {"paper", "claim", "names"}
UNHASHED = ("title", "notes", "results")
RECORD_FILE = "experiment.json"  # what the engine records beside a run's results


@dataclass(frozen=True)
class Comparison:
    claim: str
    treatment: str
    control: str
    setting: str | None = None  # the env, bsuite experiment or benchmark setting the two methods are read in


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    path: Path
    title: str
    kind: str
    run: dict[str, Any]
    seeds: range
    tuning: dict[str, Any] | None
    budget: dict[str, str]
    measure: dict[str, Any]
    comparisons: tuple[Comparison, ...]
    results: Path | None  # the published results (a directory or a results file): relative to the repository, or to
    # the spec's own folder for a spec outside it
    notes: str = ""
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # a spec's own claims (your own experiment's)
    data: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def hash(self) -> str:
        """sha256 of what the experiment is (its command, seeds, tuning, budget, measure and comparisons): its title,
        notes and where its results are published may change without making it another experiment; comments and
        layout never do."""
        identity = {k: v for k, v in self.data.items() if k not in UNHASHED}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    @property
    def settings(self) -> list[str | None]:
        return list(dict.fromkeys(c.setting for c in self.comparisons)) or [None]

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(m for c in self.comparisons for m in (c.treatment, c.control)))


def _fail(where: str, message: str) -> VcbmGymError:
    return VcbmGymError(f"experiment spec {where}: {message}")


def _seeds(where: str, value: Any, key: str) -> range:
    if not isinstance(value, dict) or set(value) != {"start", "n"}:
        raise _fail(where, f"{key}={value!r}: expected {{start: INT, n: INT}}")
    start, n = value["start"], value["n"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, n)) or start < 0 or n < 1:
        raise _fail(where, f"{key}={value!r}: expected start >= 0 and n >= 1, integers")
    return range(start, start + n)


def parse_spec(data: Any, name: str, path: Path) -> ExperimentSpec:
    """A spec from its parsed YAML; one line naming the first bad field."""
    where = str(path)
    if not isinstance(data, dict):
        raise _fail(where, f"expected a mapping of {', '.join(sorted(SPEC_KEYS))}")
    unknown = set(data) - SPEC_KEYS
    missing = SPEC_KEYS - {"tuning", "notes", "results", "claims"} - set(data)
    if unknown or missing:
        raise _fail(where, f"unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; expected {sorted(SPEC_KEYS)}")
    if data["kind"] not in KINDS:
        raise _fail(where, f"kind={data['kind']!r}: expected one of {', '.join(KINDS)}")
    if not isinstance(data["run"], dict):
        raise _fail(where, f"run={data['run']!r}: expected a mapping of the {data['kind']} command's settings")
    seeds = _seeds(where, data["seeds"], "seeds")
    tuning = data.get("tuning")
    if tuning is not None:
        if not isinstance(tuning, dict) or "by" not in tuning:
            raise _fail(where, f"tuning={tuning!r}: expected {{by: WHERE THE SETTINGS WERE CHOSEN, seeds: {{start, n}}}}")
        if "seeds" in tuning:
            tuned = _seeds(where, tuning["seeds"], "tuning.seeds")
            overlap = sorted(set(tuned) & set(seeds))
            if overlap:
                raise _fail(
                    where, f"seeds {overlap[0]}..{overlap[-1]} both chose the settings and test them: expected disjoint seeds"
                )
    budget = data["budget"]
    if not isinstance(budget, dict) or set(budget) != {"ours", "paper"}:
        raise _fail(where, f"budget={budget!r}: expected {{ours: TEXT, paper: TEXT}}")
    measure = data["measure"]
    if not isinstance(measure, dict) or "name" not in measure:
        raise _fail(where, f"measure={measure!r}: expected {{name: MEASURE, ...}}")
    from algorithms.experiment.measures import MEASURES  # the measures read results; specs only name them

    if measure["name"] not in MEASURES:
        raise _fail(where, f"measure {measure['name']!r}: expected one of {', '.join(MEASURES)}")
    comparisons = []
    for item in data["comparisons"] or []:
        if not isinstance(item, dict) or not {"claim", "treatment", "control"} <= set(item) <= {
            "claim",
            "treatment",
            "control",
            "setting",
        }:
            raise _fail(where, f"comparison {item!r}: expected {{claim, treatment, control[, setting]}}")
        comparisons.append(Comparison(**{k: (str(v) if v is not None else None) for k, v in item.items()}))
    results = data.get("results")
    own_claims = check_claims(data.get("claims") or {}, where)
    return ExperimentSpec(
        name=name,
        path=path,
        title=str(data["title"]),
        kind=data["kind"],
        run=dict(data["run"]),
        seeds=seeds,
        tuning=tuning,
        budget={k: str(v) for k, v in budget.items()},
        measure=dict(measure),
        comparisons=tuple(comparisons),
        results=Path(results) if results else None,
        notes=str(data.get("notes") or ""),
        claims=own_claims,
        data=data,
    )


def _read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise VcbmGymError(f"{what} {str(path)!r} cannot be read ({type(exc).__name__}): expected a YAML file") from None


def spec_names(spec_dir: Path | None = None) -> list[str]:
    """The registered experiments, by file name (in `SPEC_DIR` as it stands when called, unless `spec_dir`)."""
    spec_dir = SPEC_DIR if spec_dir is None else spec_dir
    return sorted(p.stem for p in spec_dir.glob("*.yml") if p != spec_dir / CLAIMS_FILE.name)


def load_spec(name_or_path: str, spec_dir: Path | None = None) -> ExperimentSpec:
    """A registered experiment by name (from `SPEC_DIR` as it stands when called, unless `spec_dir`), or a spec file by
    path (`--spec path.yml`: your own experiment)."""
    spec_dir = SPEC_DIR if spec_dir is None else spec_dir
    candidate = Path(name_or_path)
    if candidate.suffix in (".yml", ".yaml"):
        if not candidate.is_file():
            raise VcbmGymError(f"--spec {name_or_path!r}: no such file; expected a spec YAML file")
        return parse_spec(_read_yaml(candidate, "experiment spec"), candidate.stem, candidate.resolve())
    path = spec_dir / f"{name_or_path}.yml"
    if name_or_path == CLAIMS_FILE.stem or not path.is_file():
        raise VcbmGymError(f"unknown experiment {name_or_path!r}; expected one of: {', '.join(spec_names(spec_dir))}")
    return parse_spec(_read_yaml(path, "experiment spec"), name_or_path, path)


def load_claims(path: Path = CLAIMS_FILE) -> dict[str, dict[str, Any]]:
    """Every paper claim of the zoo's rules, objectives and algos: id -> {paper, claim, names}."""
    return check_claims(_read_yaml(path, "claims file"), f"claims file {str(path)!r}")


def check_claims(data: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(data, dict):
        raise VcbmGymError(f"{where}: expected a mapping of claim id to {{paper, claim, names}}")
    for claim_id, claim in data.items():
        if not isinstance(claim, dict) or set(claim) != CLAIM_KEYS or not isinstance(claim["names"], list):
            raise VcbmGymError(f"{where}: claim {claim_id!r}: expected keys {sorted(CLAIM_KEYS)}, names a list")
    return data


def all_claims(extra_specs: list[ExperimentSpec]) -> dict[str, dict[str, Any]]:
    """claims.yml and the claims of specs outside it (your own experiments); an id claimed twice is one line."""
    claims = dict(load_claims())
    for spec in extra_specs:
        for claim_id, claim in spec.claims.items():
            if claim_id in claims:
                raise VcbmGymError(
                    f"experiment spec {spec.path}: claim {claim_id!r} is already a claim of the zoo; expected a new id"
                )
            claims[claim_id] = claim
    return claims


# --- registration: which spec made a results directory, and was it committed first ---


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def spec_commit(spec: ExperimentSpec) -> str | None:
    """The last commit that changed the spec file, or None where the file differs from it (or is not committed)."""
    try:
        relative = spec.path.relative_to(REPO)
    except ValueError:
        return None  # a spec outside the repository: the run records its hash only
    if _git("status", "--porcelain", "--", str(relative)):
        return None
    return _git("log", "-1", "--format=%H", "--", str(relative)) or None


def spec_at_commit(spec: ExperimentSpec, commit: str) -> ExperimentSpec | None:
    """The spec as it was at `commit`, or None where it did not exist there."""
    try:
        relative = spec.path.relative_to(REPO)
    except ValueError:
        return None
    text = _git("show", f"{commit}:{relative.as_posix()}")
    if text is None:
        return None
    try:
        return parse_spec(yaml.safe_load(text), spec.name, spec.path)
    except (yaml.YAMLError, VcbmGymError):
        return None


def runs_of(spec: ExperimentSpec, seeds: int) -> int:
    """The runs the experiment makes at `seeds` per method (a benchmark script is one)."""
    if spec.kind == "script":
        return 1
    if spec.kind == "llm":
        return len(spec.run["settings"]) * len(run_methods(spec)) * seeds
    return len(run_methods(spec)) * len(suite_settings(spec)) * seeds


def planned_runs(spec: ExperimentSpec) -> int | None:
    """The runs an experiment in progress is heading for: a suite's or LLM study's count at the spec's seeds, None for
    a benchmark script, whose jobs only the script knows (`runs_of` counts it as one invocation)."""
    return None if spec.kind == "script" else runs_of(spec, len(spec.seeds))


def planned_runs_text(spec: ExperimentSpec) -> str:
    """`planned_runs` in a table: "-" where only the script knows."""
    total = planned_runs(spec)
    return "-" if total is None else str(total)


def run_methods(spec: ExperimentSpec) -> list[str]:
    """The methods the experiment runs: a suite's algos, an LLM study's methods, else those its comparisons name."""
    return list(spec.run.get("algos", spec.run.get("methods", spec.methods)))


def suite_settings(spec: ExperimentSpec) -> list[Any]:
    """The settings each method plays: a suite's protocol's (or its listed ones), else one."""
    if spec.kind != "suite":
        return [None]
    from algorithms.experiment import suite

    run = spec.run
    return suite.protocol_settings(run["experiment"], run.get("protocol") or "bsuite", run.get("episodes"), run.get("settings"))


def run_record(spec: ExperimentSpec, deviations: dict[str, Any]) -> dict[str, Any]:
    """OUT/experiment.json: the spec a run was made under (its hash and commit) and how the command deviated from it."""
    return {"experiment": spec.name, "spec_hash": spec.hash, "spec_commit": spec_commit(spec), "deviations": deviations}


def registration(spec: ExperimentSpec, results_dir: Path) -> dict[str, Any]:
    """How a results directory relates to the spec as it stands.

    status: `registered` (made by the engine under this spec's hash, the spec committed before the run),
    `unregistered` (made under this hash, the spec uncommitted at the time), `changed` (made under another version
    of the spec: kept apart, never scored as this spec), `deviating` (the command overrode the spec's seeds or
    budget: exploratory), or `predates-spec` (a result made before the spec existed, migrated into it: scored, and
    said so). `registered_before_first_run` is the yes/no RESULTS.md prints."""
    record_path = results_dir / RECORD_FILE
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("spec_hash") != spec.hash:
            status = "changed"
        elif record.get("deviations"):
            status = "deviating"
        else:
            status = "registered" if record.get("spec_commit") else "unregistered"
        return {"status": status, "registered_before_first_run": bool(record.get("spec_commit")), "record": record}
    run = read_run_json(results_dir)
    commit = run.get("git_commit") if run else None
    earlier = spec_at_commit(spec, commit) if commit else None
    if earlier is not None:
        status = "registered" if earlier.hash == spec.hash else "changed"
        return {"status": status, "registered_before_first_run": True, "record": {"git_commit": commit}}
    return {"status": "predates-spec", "registered_before_first_run": False, "record": {"git_commit": commit}}


def read_run_json(results: Path) -> dict[str, Any] | None:
    """The run record of a results directory (run.json), or of a single results file (its `run` entry)."""
    if results.is_dir():
        path = results / "run.json"
        return json.loads(path.read_text()) if path.is_file() else None
    if results.is_file():
        run = json.loads(results.read_text()).get("run")
        return run if isinstance(run, dict) else None
    return None
