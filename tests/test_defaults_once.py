"""Every hyperparameter default is written once: a literal default value given to the same name in two
places (two dataclass fields, a constructor and a helper function, ...) is two sources that can drift apart, as
`z_thresh = 4.0` once did in tabular VCBM's config, the vcbm_bookmark rule and `classify_roles`. The second place
names the first instead (a module constant such as causal_roles.Z_THRESH, or the config's field).

Scanned: dataclass fields and the parameters of every function and method (constructors included) in SCANNED.
A default of None (nothing given) is not a value. A name may carry literal defaults in several places only where
the places mean different things; LEGITIMATE lists each such place, with the reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The credit rules, the env contract, and the three arms with what they share. The experiment commands
# (algorithms/experiment: compare, tune, plot, suite, stats) are not scanned: their defaults are command
# options (workers, windows, resamples), not a run's hyperparameters.
SCANNED = (
    "vcbm_gym",
    "algorithms/common",
    "algorithms/tabular",
    "algorithms/sb3",
    "algorithms/train.py",
    "algorithms/evaluate.py",
    "algorithms/credit_fidelity.py",
    "algorithms/registry.py",
    "algorithms/llm",
)

# name -> {(file, owner): why this place's default is not the same setting as the others'}
LEGITIMATE: dict[str, dict[tuple[str, str], str]] = {
    "alpha": {
        ("vcbm_gym/credit/vcbm_bookmark.py", "VCBMBookmarkRule.__init__"): "Eq. 13's floor weight, not a step size",
        ("vcbm_gym/credit/vcbm_blend.py", "VCBMBlendRule.__init__"): "Eq. 13's floor weight, not a step size",
        ("vcbm_gym/credit/vcbm_blend.py", "retrieval_weights"): "Eq. 13's floor weight, not a step size",
    },
    "baseline": {
        ("vcbm_gym/credit/ircr.py", "IRCRRule.__init__"): "IRCR's baselines are another set (ircr.BASELINES), on its scale",
    },
    "beta": {
        ("vcbm_gym/credit/vcbm_blend.py", "VCBMBlendRule.__init__"): "Eq. 14's blend of LOO and VCBM",
        ("vcbm_gym/credit/set_credit.py", "CASIShapingRule.__init__"): "CASI's shaping weight",
        ("algorithms/credit_fidelity.py", "train_comparison"): "the benchmark's own shaping weight for its REINFORCE runs",
    },
    "bound": {
        ("vcbm_gym/credit/set_credit.py", "CASIShapingRule.__init__"): "CASI's shaping bound",
        ("algorithms/credit_fidelity.py", "train_comparison"): "the benchmark's bound for its linear policy (0.2, not 1.0)",
    },
    "buffer_capacity": {
        ("vcbm_gym/credit/rudder.py", "RudderLSTMConfig"): "RUDDER's lesson buffer",
        ("vcbm_gym/credit/rrd.py", "RRDConfig"): "RRD's episode buffer: another model, sized on its own",
    },
    "batch_size": {
        ("vcbm_gym/credit/rudder.py", "RudderLSTMConfig"): "episodes per LSTM training step",
        ("algorithms/tabular/vcbm_batch.py", "run_batch"): "seeds per numpy batch",
    },
    "learning_rate": {
        ("algorithms/llm/config.py", "LoopConfig"): "LOOP's optimizer (Sec. V-B)",
        ("algorithms/llm/model/warm_start.py", "WarmStartConfig"): "the format warm-start's SFT",
        ("vcbm_gym/credit/rudder.py", "RudderLSTMConfig"): "RUDDER's LSTM",
        ("vcbm_gym/credit/rrd.py", "RRDConfig"): "RRD's reward model",
    },
    "min_buffer_episodes": {
        ("vcbm_gym/credit/rudder.py", "RudderLSTMConfig"): "RUDDER's training start",
        ("vcbm_gym/credit/rrd.py", "RRDConfig"): "RRD's training start",
    },
    "gamma": {
        ("vcbm_gym/credit/gigpo.py", "GiGPORule.__init__"): "GiGPO's discount of turn returns",
        ("algorithms/tabular/q_learning.py", "QLearningConfig"): "Q-learning's discount",
    },
    "eps": {
        ("vcbm_gym/credit/model_training.py", "adam_step"): "Adam's epsilon, not a group std's",
    },
    "q_init": {
        ("algorithms/tabular/q_learning.py", "QLearningConfig"): "td's Q over every state starts at 0 (mc, rudder: OPTIMISTIC_Q)",
    },
    "max_episodes": {
        ("algorithms/common/convergence.py", "EpisodeRunConfig"): "the tabular agents' episode cap",
        ("algorithms/sb3/runner.py", "SB3RunConfig"): "SB3's own cap overrides it: the deep agents need more episodes",
    },
    "credit": {
        ("vcbm_gym/credit/set_credit.py", "CASIShapingRule.__init__"): "CASI's coalition rule (shapley), not a run's credit rule",
    },
    "seed": {
        ("algorithms/llm/model/tiny.py", "build_tiny_model"): "a seed",
        ("algorithms/llm/model/tiny.py", "build_tiny"): "a seed",
        ("vcbm_gym/contract.py", "check_contract"): "a seed, not a hyperparameter: every seeded object starts from 0",
        ("vcbm_gym/credit/rudder.py", "GatelessLSTM.__init__"): "a seed",
        ("vcbm_gym/credit/model_training.py", "LessonBuffer.__init__"): "a seed",
        ("vcbm_gym/credit/rudder.py", "RudderRule.__init__"): "a seed",
        ("vcbm_gym/credit/rrd.py", "RewardModel.__init__"): "a seed",
        ("vcbm_gym/credit/rrd.py", "RRDRule.__init__"): "a seed",
    },
    "steps": {
        ("vcbm_gym/contract.py", "probe_steps"): "random steps the contract probe plays",
        ("vcbm_gym/credit/rrd.py", "TrainingStats"): "a counter of Adam steps taken, starting at 0",
    },
    "window": {
        ("algorithms/common/convergence.py", "EpisodeOutcomes.__init__"): "the moving window of returns",
    },
    "weight_decay": {
        ("vcbm_gym/credit/rudder.py", "RudderLSTMConfig"): "RUDDER's LSTM",
        ("algorithms/llm/config.py", "LoopConfig"): "LOOP's optimizer (Sec. V-B)",
    },
    "epsilon": {
        ("algorithms/llm/config.py", "LoopConfig"): "Eq. 8's PPO clip range, not an exploration rate",
    },
    "max_steps": {
        ("algorithms/llm/model/warm_start.py", "WarmStartConfig"): "the warm-start's SFT optimizer steps, not probe steps",
    },
    "hidden_size": {
        ("vcbm_gym/credit/rudder.py", "RudderLSTMConfig"): "RUDDER's LSTM width, not a language model's",
        ("algorithms/llm/model/warm_start.py", "WarmStartConfig"): (
            "the warm-started tiny model's width (128), not the untrained one's"
        ),
    },
    "tie_embeddings": {
        ("algorithms/llm/model/warm_start.py", "WarmStartConfig"): "the warm-started model unties its output layer",
    },
    "torch_threads": {
        ("algorithms/sb3/runner.py", "SB3RunConfig"): "SB3's small networks: one thread",
        ("algorithms/llm/config.py", "LoopRunConfig"): "0: torch's own default for the LLM arm",
    },
    "iterations": {
        ("algorithms/credit_fidelity.py", "train_comparison"): "the fidelity benchmark's REINFORCE iterations",
        ("algorithms/llm/config.py", "LoopRunConfig"): "LOOP iterations of a run",
    },
    "one_shot": {
        ("algorithms/llm/generation/prompting.py", "tiny_system_prompt"): "the tiny model's prompt has no one-shot example",
    },
    "episodes_per_env": {
        ("algorithms/llm/model/tiny.py", "_played_texts"): "the tokenizer's vocabulary sample, not the warm-start's data",
    },
    "mode": {
        ("vcbm_gym/credit/empo.py", "effect_cell_ids"): "EMPO's cell key",
    },
}


@dataclass(frozen=True)
class Named:
    """A default written as a name: a module constant (Z_THRESH), which is a source of the setting, or another
    place's default (RudderLSTMConfig.hidden_size), which is not a second one."""

    text: str

    @property
    def is_source(self) -> bool:
        return "." not in self.text


def _default(node: ast.expr) -> object:
    """The default's value if it is a literal (a number, string, bool, tuple of them), Named if it names a value,
    else None (a call, an expression: not compared)."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        return Named(ast.unparse(node))
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)


def defaults(path: Path, relative: str) -> list[tuple[str, str, str, object]]:
    """(name, file, owner, value) of every default in `path` that is a literal or names a value (Named);
    owner is the dataclass, or the Class.method or function whose parameter it is. None defaults are left out."""
    found: list[tuple[str, str, str, object]] = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                owner = f"{scope}{child.name}"
                if _is_dataclass(child):
                    found.extend(
                        (statement.target.id, relative, owner, _default(statement.value))
                        for statement in child.body
                        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value
                    )
                visit(child, f"{owner}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                owner = f"{scope}{child.name}"
                args = child.args
                positional = args.posonlyargs + args.args
                pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
                pairs += [(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default is not None]
                found.extend((arg.arg, relative, owner, _default(default)) for arg, default in pairs)
                visit(child, f"{owner}.")

    visit(ast.parse(path.read_text()), "")
    return [entry for entry in found if entry[3] is not None]


def scanned_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for entry in SCANNED:
        path = root / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def duplicated_defaults(root: Path) -> dict[str, list[tuple[str, str, object]]]:
    """name -> its defaults, for every name with more than one source of its default outside the places LEGITIMATE
    lists: each literal default is a source, and so is each module constant a default names (`Z_THRESH`), so that
    `z_thresh: float = 4.0` beside `z_thresh: float = Z_THRESH` is two; a default naming another place's
    (`RudderLSTMConfig.hidden_size`) adds none."""
    by_name: dict[str, list[tuple[str, str, object]]] = defaultdict(list)
    for path in scanned_files(root):
        for name, file, owner, value in defaults(path, path.relative_to(root).as_posix()):
            by_name[name].append((file, owner, value))
    out = {}
    for name, places in by_name.items():
        allowed = LEGITIMATE.get(name, {})
        sources = set()
        for file, owner, value in places:
            if (file, owner) in allowed or (isinstance(value, Named) and not value.is_source):
                continue
            sources.add(value.text if isinstance(value, Named) else (file, owner))
        if len(sources) > 1:
            out[name] = places
    return out


def test_every_hyperparameter_default_is_written_once():
    duplicated = duplicated_defaults(REPO)
    lines = [
        f"{name}: " + "; ".join(f"{file} {owner} = {value!r}" for file, owner, value in places)
        for name, places in duplicated.items()
    ]
    assert not duplicated, "literal defaults written in several places (name one source instead):\n" + "\n".join(lines)


def test_the_legitimate_places_exist():
    """A LEGITIMATE entry whose place is gone (renamed, or its default now named) must go too: a stale entry would
    let a new duplicate of that name pass."""
    present = {
        (name, file, owner)
        for path in scanned_files(REPO)
        for name, file, owner, _ in defaults(path, path.relative_to(REPO).as_posix())
    }
    stale = [(name, place) for name, places in LEGITIMATE.items() for place in places if (name, *place) not in present]
    assert not stale, stale


def _copy(tmp_path: Path, edit: tuple[str, str, str] | None = None) -> Path:
    for path in scanned_files(REPO):
        target = tmp_path / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    if edit is not None:
        relative, old, new = edit
        path = tmp_path / relative
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
    return tmp_path


@pytest.mark.parametrize(
    ("edit", "name"),
    [
        # z_thresh written again as a literal in tabular VCBM's config: the case that motivated the test
        (("algorithms/tabular/vcbm.py", "z_thresh: float = Z_THRESH", "z_thresh: float = 4.0"), "z_thresh"),
        # a helper function that re-states its rule's default
        (("vcbm_gym/credit/vcbm_blend.py", "    top_k: int = TOP_K,\n    tau", "    top_k: int = 6,\n    tau"), "top_k"),
        # a setting the tabular baselines share, written as a literal again in one of them
        (("algorithms/tabular/q_learning.py", "alpha: float = STEP_SIZE", "alpha: float = 0.1"), "alpha"),
        # a literal beside a listed place of the same name (eps: Adam's is listed; GRPO's is STD_EPS)
        (("vcbm_gym/credit/gigpo.py", "    eps: float = STD_EPS,\n) -> list", "    eps: float = 1e-4,\n) -> list"), "eps"),
    ],
)
def test_a_second_literal_default_is_found(tmp_path, edit, name):
    assert duplicated_defaults(_copy(tmp_path)) == {}
    assert name in duplicated_defaults(_copy(tmp_path / "edited", edit))
