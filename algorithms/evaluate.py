"""Evaluate a policy on an AppWorld split: TGC and SGC overall and per difficulty (Table III of the
VCBM paper, arXiv:2610.24032).

    python -m algorithms.evaluate --env AppWorld-v0 --split dev --model NAME --out DIR

NAME is
- `scripted:oracle`: each task's reference cells (`ground_truth/solution_cells.json`, written by
  the synthetic generator; the real AppWorld data ships no such file);
- `scripted:FILE.json`: `{task_id: [code, ...]}` cells to play, with `"*"` as the default for tasks
  not listed;
- `tiny` (a random tiny model, offline) or a transformers causal LM name/path: a ReAct agent with
  AppWorld's prompt (`envs.appworld.prompt`), greedy decoding.

The policy's code runs in AppWorld's bubblewrap sandbox (`--trusted-code` runs it without, on a
machine that has no bubblewrap). Every task of the split is played once (`--max-tasks` keeps the first N). A policy that stops
before the episode ends is scored on the world as it left it. Scores come from AppWorld's own
evaluator and `Metric` (run inside the AppWorld server). Writes DIR/results.json (per task),
DIR/metrics.json and DIR/table.md; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from algorithms.common import cli
from algorithms.common.cli import read_json_object
from algorithms.common.errors import VcbmGymError
from algorithms.common.extras import require_extra
from algorithms.llm.generation.prompting import truncate_messages

Policy = Callable[[str, list[dict]], str | None]  # (task_id, messages) -> code, None = stop


def scripted_policy(spec: str, data_root: Path) -> Policy:
    """Play fixed code cells; `spec` is "oracle" or a JSON file {task_id | "*": [code, ...]}."""
    if spec == "oracle":

        def cells_of(task_id: str) -> list[str]:
            path = data_root / "data" / "tasks" / task_id / "ground_truth" / "solution_cells.json"
            if not path.exists():
                raise VcbmGymError(f"scripted:oracle needs {path} (synthetic tasks only); expected a synthetic data root")
            return json.loads(path.read_text())
    else:
        path = Path(spec)
        if not path.is_file():
            raise VcbmGymError(f"--model scripted:{spec}: no such file; expected scripted:oracle or scripted:FILE.json")
        table = read_json_object(path, "--model scripted:")
        for key, cells in table.items():
            if not isinstance(cells, list) or not all(isinstance(cell, str) for cell in cells):
                raise VcbmGymError(
                    f"--model scripted:{spec}: entry {key!r} is {json.dumps(cells)[:40]}; "
                    'expected {task_id or "*": [code, ...]} with code cells as strings'
                )

        def cells_of(task_id: str) -> list[str]:
            return list(table.get(task_id, table.get("*", [])))

    def policy(task_id: str, messages: list[dict]) -> str | None:
        cells = cells_of(task_id)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return cells[turn] if turn < len(cells) else None

    return policy


def load_model(name: str, seed: int, env_id: str | None):
    """The model and tokenizer of `--model NAME`: `tiny` is the untrained tiny model of `env_id` (its own vocabulary
    where the env has one, as training builds it: algorithms.llm.build.model_and_tokenizer)."""
    if name == "tiny":
        from algorithms.llm.build import model_and_tokenizer

        return model_and_tokenizer("tiny-random", seed, False, env_id)
    from algorithms.llm.build import pretrained

    return pretrained(name, "auto", "scripted:..., tiny, or a model path/name")


def model_policy(name: str, seed: int, max_new_tokens: int, max_prompt_chars: int, env_id: str | None = None) -> Policy:
    """A ReAct agent over a causal LM (greedy); the prompt is truncated like the LOOP trainer's."""
    import torch

    model, tokenizer = load_model(name, seed, env_id)
    model.eval()

    def policy(task_id: str, messages: list[dict]) -> str | None:
        prompt = tokenizer.apply_chat_template(
            truncate_messages(messages, max_prompt_chars), add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        with torch.no_grad():
            out = model.generate(
                **ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    return policy


def table_iii(metrics: dict, mean_return: float) -> list[tuple[str, float | None]]:
    """Rows of the paper's Table III (fractions, not percent), plus SGC; a difficulty with no
    task is None (AppWorld's Metric would report 0 for it)."""
    rows = {
        row: dict(zip(metrics["table"]["type"], metrics["table"][row]))
        for row in ("task_goal_completion", "scenario_goal_completion")
    }

    def cell(row: str, key: str) -> float | None:
        if key.startswith("difficulty_") and not metrics["counts"].get(key.removeprefix("difficulty_"), 0):
            return None
        value = rows[row].get(key)
        return None if value is None else value / 100.0

    tgc = [cell("task_goal_completion", f"difficulty_{d}") for d in (1, 2, 3)]
    present = [value for value in tgc if value is not None]
    return [
        ("return", mean_return),
        ("TGC, all diff.", cell("task_goal_completion", "aggregate")),
        ("TGC, diff.-avg.", sum(present) / len(present) if present else None),
        *[(f"TGC, difficulty {d}", value) for d, value in zip((1, 2, 3), tgc)],
        ("SGC, all diff.", cell("scenario_goal_completion", "aggregate")),
        *[(f"SGC, difficulty {d}", cell("scenario_goal_completion", f"difficulty_{d}")) for d in (1, 2, 3)],
    ]


def format_table(rows: list[tuple[str, float | None]], model: str, counts: dict) -> str:
    lines = [f"| Metric | {model} |", "|---|---|"]
    lines += [f"| {name} | {'n/a' if value is None else f'{value:.4f}'} |" for name, value in rows]
    lines.append(f"\nTasks per difficulty: {json.dumps(counts)}")
    return "\n".join(lines)


def check_arguments(args: argparse.Namespace) -> Path:
    """Every argument checked before anything is scored (a bad --out would throw the evaluation away); the --out
    directory, created only to write the results."""
    if args.env != "AppWorld-v0":
        raise VcbmGymError(f"--env {args.env!r}: this evaluator scores AppWorld tasks; expected AppWorld-v0")
    cli.check_seed(args.seed)
    cli.check_int(args.max_tasks, "--max-tasks", 0)
    cli.check_int(args.max_interactions, "--max-interactions", 1, 10_000)
    cli.check_int(args.max_new_tokens, "--max-new-tokens", 1)
    cli.check_int(args.max_prompt_chars, "--max-prompt-chars", 1)
    if not args.model.startswith("scripted:"):  # a model policy runs on transformers
        require_extra(f"--model {args.model}", "llm")
    return cli.check_output_dir(args.out, "--out")


def split_task_ids(appworld, args: argparse.Namespace) -> list[str]:
    """The split's tasks (of --difficulty, the first --max-tasks), or one line saying why there are none."""
    from envs.appworld.pool import AppWorldServerError, SandboxUnavailableError

    try:
        task_ids = appworld.task_ids(args.split, args.difficulty)
    except SandboxUnavailableError as error:
        raise VcbmGymError(f"{error} (here: --trusted-code)") from None
    except AppWorldServerError as error:
        raise VcbmGymError(f"--split {args.split!r}: {error}") from None
    task_ids = task_ids[: args.max_tasks] if args.max_tasks else task_ids
    if not task_ids:
        raise VcbmGymError(f"--split {args.split!r} (difficulty {args.difficulty}) has no tasks")
    return task_ids


def play_task(env, policy: Policy, task_id: str, args: argparse.Namespace) -> tuple[dict, float]:
    """One episode of `task_id` under `policy`: AppWorld's evaluation of the world it leaves, and its return.
    A policy that stops early is scored on the world as it left it (the fraction of tests passed)."""
    from envs.appworld.pool import AppWorldServerError
    from envs.appworld.prompt import system_prompt

    observation, _ = env.reset(seed=args.seed, options={"task_id": task_id})
    messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": observation}]
    done, reward, step_info = False, 0.0, {}
    while not done:
        action = policy(task_id, messages)
        if action is None:
            break
        observation, reward, terminated, truncated, step_info = env.step(action)
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
        done = terminated or truncated
    try:
        evaluation = step_info["evaluation"] if done else env.unwrapped.evaluate()
    except AppWorldServerError as error:
        raise VcbmGymError(f"task {task_id!r} of --split {args.split!r} cannot be scored: {error}") from None
    if evaluation is None:
        raise VcbmGymError(f"task {task_id!r} of --split {args.split!r} has no ground truth to score against")
    if not done:
        reward = evaluation["pass_count"] / evaluation["num_tests"] if evaluation["num_tests"] else 0.0
    print(
        f"{task_id}: difficulty {evaluation['difficulty']}, passed {evaluation['pass_count']}/{evaluation['num_tests']}, "
        f"success {evaluation['success']}, turns {sum(1 for m in messages if m['role'] == 'assistant')}",
        file=sys.stderr,
    )
    return evaluation, float(reward)


def write_results(out: Path, args: argparse.Namespace, results: dict, returns: dict, metrics: dict) -> dict:
    """results.json, metrics.json and table.md in `out` (each written atomically); the table is printed."""
    counts: dict[str, int] = {}
    for evaluation in results.values():
        counts[str(evaluation["difficulty"])] = counts.get(str(evaluation["difficulty"]), 0) + 1
    metrics["counts"] = counts
    mean_return = sum(returns.values()) / len(returns)
    rows = table_iii(metrics, mean_return)
    cli.output_dir(out, "--out")
    cli.atomic_write_json(out / "results.json", {t: {**results[t], "return": returns[t]} for t in results})
    summary = {
        "env": args.env,
        "split": args.split,
        "model": args.model,
        "num_tasks": len(results),
        "mean_return": mean_return,
        "table_iii": dict(rows),
        "appworld_metrics": metrics,
    }
    cli.atomic_write_json(out / "metrics.json", summary)
    table = format_table(rows, args.model, counts)
    cli.atomic_write_text(out / "table.md", table + "\n")
    print(table)
    return summary


def evaluate(args: argparse.Namespace) -> dict:
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers AppWorld-v0)
    from envs.appworld.pool import default_root

    out = check_arguments(args)
    data_root = Path(args.appworld_root or default_root())
    if args.model.startswith("scripted:"):
        policy = scripted_policy(args.model.removeprefix("scripted:"), data_root)
    else:
        policy = model_policy(args.model, args.seed, args.max_new_tokens, args.max_prompt_chars, args.env)

    env_kwargs = {"split": args.split, "max_interactions": args.max_interactions}
    if args.appworld_root:
        env_kwargs["appworld_root"] = args.appworld_root
    if args.trusted_code:
        env_kwargs["trusted_code"] = True
    env = gym.make("AppWorld-v0", **env_kwargs)
    try:
        results, returns = {}, {}
        for task_id in split_task_ids(env.unwrapped, args):
            results[task_id], returns[task_id] = play_task(env, policy, task_id, args)
        metrics = env.unwrapped.metrics(results)
    finally:
        env.close()
    return write_results(out, args, results, returns, metrics)


def build_parser() -> argparse.ArgumentParser:
    # the docstring's first paragraph, whole: its first line ends mid-sentence
    parser = cli.ArgumentParser(prog="python -m algorithms.evaluate", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--env", default="AppWorld-v0")
    parser.add_argument("--split", default="dev", help="AppWorld dataset: train, dev, test_normal, test_challenge")
    parser.add_argument("--model", required=True, help="scripted:oracle, scripted:FILE.json, tiny, or a HF causal LM")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--difficulty", type=int, choices=(1, 2, 3), default=None)
    parser.add_argument("--max-tasks", type=int, default=0, help="evaluate only the first N tasks (0 = all)")
    parser.add_argument("--max-interactions", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=1500)
    parser.add_argument("--max-prompt-chars", type=int, default=20_000)
    parser.add_argument("--appworld-root", default=None, help="data root (default $VCBM_APPWORLD_ROOT)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trusted-code",
        action="store_true",
        help="run the policy's code without the bubblewrap sandbox (only where bwrap is unavailable)",
    )
    return parser


def run(argv: list[str]) -> dict:
    return evaluate(build_parser().parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
