"""The import graph keeps its layers: no circle, and no import from a lower floor up to a higher one.

Floors (ARCHITECTURE.md): envs (0) -> vcbm_gym (1) -> algorithms.common (2) -> the arms (3) -> the registry,
which names each algo's arm, and the commands that run one thing (4) -> the experiment package,
algorithms.experiment, whose commands run many (5, the top floor; algorithms.compare, .tune, .plot, .suite and
.stats keep their names there by re-exporting it). Every import counts, at module level or inside a function (a
lazy import is still a dependency), and so does a string that names a project module ("pkg.module" or
"pkg.module:Attribute", as the registry, the arms' agent tables and the rule table import by name).

Inside the LLM arm the subpackages keep floors of their own, so the folder shows where credit enters: playing episodes
(generation) -> the tiny models (model) -> training on them, where the credit rule enters, with the trainer's settings
(training, config) -> two roles of one model (two_role) -> assembling a run (build, resolve, report) -> the runners.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "vcbm_gym", "algorithms")
ARMS = ("tabular", "sb3", "llm")
SINGLE_RUN_COMMANDS = ("registry", "train", "evaluate", "credit_fidelity", "bsuite_score")
EXPERIMENT = ("experiment", "compare", "tune", "plot", "suite", "stats")  # the package, and its commands' old names
TOP = 5


def floor(module: str) -> int:
    top, _, rest = module.partition(".")
    if top == "envs":
        return 0
    if top == "vcbm_gym":
        return 1
    second = rest.partition(".")[0]
    if not second or second == "common":
        return 2
    if second in ARMS:
        return 3
    if second in SINGLE_RUN_COMMANDS:
        return 4
    if second in EXPERIMENT:
        return TOP
    return TOP  # a module no floor names yet may import anything; nothing below may import it


LLM = "algorithms.llm"
LLM_FLOORS = (
    ("generation",),
    ("model",),
    ("training", "config"),
    ("two_role",),
    ("build", "resolve", "report"),
    ("runner", "two_role.runner"),  # the arm's runner modules, which the registry names
)


def llm_floor(module: str) -> int | None:
    """The floor inside the LLM arm of one of its modules (the longest matching name wins); None outside the arm and for
    the arm's package itself, which holds no code."""
    if not module.startswith(f"{LLM}."):
        return None
    rest = module.removeprefix(f"{LLM}.")
    matches = [
        (len(name), number)
        for number, names in enumerate(LLM_FLOORS)
        for name in names
        if rest == name or rest.startswith(f"{name}.")
    ]
    assert matches, f"{module} is on no floor of the LLM arm: add it to LLM_FLOORS"
    return max(matches)[1]


def project_modules(root: Path) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


STRING = "string:"  # marks a name taken from a string constant
MODULE_STRING = re.compile(r"(?:envs|vcbm_gym|algorithms)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")


def imported_names(module: str, path: Path) -> set[str]:
    """Every name an import statement of the module could mean (`from a import b`: a and a.b), and every string
    constant that names a module ("a.b" or "a.b:C", imported by name with importlib)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            names.add(STRING + node.value.partition(":")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = project_modules(root)

    def owner(name: str) -> str | None:  # the project module a dotted name lies in, if any
        if name.startswith(STRING):  # a string names a module only when it is one (not an entry-point group)
            return name[len(STRING) :] if name[len(STRING) :] in modules else None
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        graph[module] = {target for name in imported_names(module, path) if (target := owner(name)) not in (None, module)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if floor(target) > floor(module)
    ]


def upward_llm_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} (LLM floor {llm_floor(module)}) imports {target} (LLM floor {llm_floor(target)})"
        for module, targets in sorted(graph.items())
        if llm_floor(module) is not None
        for target in sorted(targets)
        if llm_floor(target) is not None and llm_floor(target) > llm_floor(module)
    ]


def test_the_project_has_no_import_circle():
    assert circles(import_graph(REPO)) == []


def test_no_module_imports_from_a_higher_floor():
    assert upward_imports(import_graph(REPO)) == []


def test_no_llm_arm_module_imports_from_a_higher_floor_of_the_arm():
    graph = import_graph(REPO)
    assert upward_llm_imports(graph) == []
    # every floor holds a module, and the runners the registry names sit on the top one
    assert {llm_floor(m) for m in graph if llm_floor(m) is not None} == set(range(len(LLM_FLOORS)))
    assert llm_floor("algorithms.llm.runner") == llm_floor("algorithms.llm.two_role.runner") == len(LLM_FLOORS) - 1


def test_the_experiment_package_is_the_top_floor_and_its_old_names_only_re_export_it():
    graph = import_graph(REPO)
    experiment = sorted(m for m in graph if m.startswith("algorithms.experiment"))
    assert "algorithms.experiment.compare" in experiment and "algorithms.experiment.executor" in experiment
    assert {floor(m) for m in experiment} == {TOP} and max(floor(m) for m in graph) == TOP
    below = sorted(m for m, targets in graph.items() if floor(m) < TOP and any(t in experiment for t in targets))
    assert below == []
    for name in ("compare", "tune", "plot", "suite", "stats"):
        assert graph[f"algorithms.{name}"] == {f"algorithms.experiment.{name}"}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
    return tmp_path


@pytest.mark.parametrize("lazy", [False, True])
def test_the_checks_find_a_circle_and_an_upward_import_even_inside_a_function(tmp_path, lazy):
    """The checks themselves: a planted circle (relative import included) and a lazy upward import are found."""
    indent = "def f():\n    " if lazy else ""
    root = _tree(
        tmp_path,
        {
            "algorithms/__init__.py": "",
            "algorithms/common/__init__.py": "",
            "algorithms/common/a.py": f"{indent}from algorithms.train import run\n",
            "algorithms/train.py": f"{indent}from .common import a\n",
            "algorithms/registry.py": f"{indent}import algorithms.experiment.jobs\n",
            "algorithms/tabular/__init__.py": "",
            "algorithms/tabular/runner.py": 'RUNNER = "algorithms.registry:ALGOS"\n',
            "algorithms/experiment/__init__.py": "",
            "algorithms/experiment/jobs.py": "from algorithms import train\n",
            "envs/__init__.py": "",
            "envs/x.py": f"{indent}import vcbm_gym.contract\n",
            "vcbm_gym/__init__.py": "",
            "vcbm_gym/contract.py": "import envs.x\n",
            "algorithms/llm/__init__.py": "",
            "algorithms/llm/generation/__init__.py": "",
            "algorithms/llm/generation/rollout.py": f"{indent}from algorithms.llm.training import loss\n",
            "algorithms/llm/training/__init__.py": "",
            "algorithms/llm/training/loss.py": "from algorithms.llm.generation import rollout\n",
            "algorithms/llm/two_role/__init__.py": "",
            "algorithms/llm/two_role/config.py": 'PROMPT = "algorithms.llm.two_role.runner:ARM"\n',
            "algorithms/llm/two_role/runner.py": "from algorithms.llm.two_role import config\n",
        },
    )
    graph = import_graph(root)
    assert circles(graph) == [
        ["algorithms.common.a", "algorithms.train"],
        ["algorithms.llm.generation.rollout", "algorithms.llm.training.loss"],
        ["algorithms.llm.two_role.config", "algorithms.llm.two_role.runner"],
        ["envs.x", "vcbm_gym.contract"],
    ]
    assert upward_imports(graph) == [
        "algorithms.common.a (floor 2) imports algorithms.train (floor 4)",
        "algorithms.registry (floor 4) imports algorithms.experiment.jobs (floor 5)",
        "algorithms.tabular.runner (floor 3) imports algorithms.registry (floor 4)",
        "envs.x (floor 0) imports vcbm_gym.contract (floor 1)",
    ]
    assert upward_llm_imports(graph) == [
        "algorithms.llm.generation.rollout (LLM floor 0) imports algorithms.llm.training (LLM floor 2)",
        "algorithms.llm.generation.rollout (LLM floor 0) imports algorithms.llm.training.loss (LLM floor 2)",
        "algorithms.llm.two_role.config (LLM floor 3) imports algorithms.llm.two_role.runner (LLM floor 5)",
    ]
