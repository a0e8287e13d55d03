"""Silent faults of the LLM arm: KL direction, completion of undecided episodes, turn limits, memory."""

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from algorithms.common.errors import ConfigError  # noqa: E402
from algorithms.llm.training.loss import kl_old_new  # noqa: E402
from algorithms.llm.training.metrics import decision_advantage_mass, task_goal_completion  # noqa: E402
from algorithms.train import run  # noqa: E402
from tests.helpers import tiny_llm_argv  # noqa: E402

SMALL = ["generation_batch_size=4", "num_generations=2", "per_device_train_batch_size=4", "max_new_tokens_per_turn=4"]


def test_kl_estimate_is_unbiased_for_kl_old_to_new_on_samples_from_old():
    p_old = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    p_new = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64)
    # one token per row: the estimate for every outcome x, weighted by its probability under pi_old
    per_outcome = kl_old_new(p_old.log()[:, None], p_new.log()[:, None], torch.ones(5, 1, dtype=torch.float64))
    expectation = float((p_old * per_outcome).sum())
    exact = float((p_old * (p_old / p_new).log()).sum())
    assert expectation == pytest.approx(exact, rel=1e-12)
    assert torch.all(per_outcome >= 0)
    # the former estimator, exp(d) - d - 1 with d = logp_old - logp_new, is off by far more here
    d = p_old.log() - p_new.log()
    former = float((p_old * (torch.exp(d) - d - 1)).sum())
    assert abs(former - exact) > 0.5
    # masked tokens contribute nothing; rows sum over their tokens
    two = kl_old_new(p_old.log()[None, :2], p_new.log()[None, :2], torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    assert float(two) == pytest.approx(float(per_outcome[0]))


def test_task_goal_completion_counts_episodes_without_a_verdict_as_failures():
    infos = [{"task_goal_completion": 1.0}, {}, {"task_goal_completion": 1.0}, {"brand": 2}]
    assert task_goal_completion(infos)["task_goal_completion"] == 0.5  # not 1.0 over the decided two
    assert task_goal_completion([{}, {"brand": 1}]) == {}  # an env without the key reports nothing
    levels = task_goal_completion([{"success": True, "difficulty": 1}, {"difficulty": 1}, {"success": True, "difficulty": 2}])
    assert levels == {
        "task_goal_completion": pytest.approx(2 / 3),
        "task_goal_completion/difficulty_1": 0.5,
        "task_goal_completion/difficulty_2": 1.0,
    }


def test_decision_advantage_mass_is_the_share_of_absolute_advantage_on_deciding_tokens():
    adv = np.array([[2.0, 2.0, -1.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    decision = np.array([[1, 0, 0, 1], [0, 0, 1, 1]], bool)
    assert decision_advantage_mass(adv, mask, decision) == pytest.approx((2.0 + 1.0) / (5.0 + 2.0))
    assert decision_advantage_mass(np.zeros((2, 4)), mask, decision) == 0.0


def test_a_trainer_turn_limit_below_the_envs_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"max_turns=3 is below TextWatchRepair-v0's own turn limit \(6\)"):
        run(tiny_llm_argv("loop", tmp_path, hyperparams=["max_turns=3", *SMALL]))


@pytest.mark.slow
def test_memory_is_bounded_and_keeps_no_rollouts_of_aborted_iterations(tmp_path):
    # the random tiny model names one of the station's tools in some turns: those are the bookmarks
    def vcbm(name, *extra):
        small = ["generation_batch_size=8", "num_generations=2", "per_device_train_batch_size=8", "max_new_tokens_per_turn=16"]
        return run(tiny_llm_argv("vcbm-loop", tmp_path / name, env="TextWatchWorkshop-v0", hyperparams=[*small, *extra]))

    unbounded = vcbm("all")
    assert unbounded["memory_size"] > 3
    assert vcbm("bounded", "credit_kwargs={vcbm_blend: {memory_capacity: 3}}")["memory_size"] == 3
    aborted = vcbm("aborted", "kl_abort=1.0e-12")
    assert aborted["final_iteration_aborted"] == 1.0 and aborted["memory_size"] == 0


@pytest.mark.slow
def test_trl_grpo_baseline_runs_the_same_episodes_with_trls_advantage(tmp_path):
    hyperparams = ["generation_batch_size=8", "num_generations=4", "per_device_train_batch_size=8", "max_new_tokens_per_turn=16"]
    summary = run(tiny_llm_argv("trl-grpo", tmp_path, iterations=2, hyperparams=hyperparams))
    assert summary["iterations_run"] == 2 and summary["finetune"] == "full"
    assert summary["trained_weight_change_l2"] > 0
    for key in ("final_task_goal_completion", "final_invalid_turn_rate", "final_decision_advantage_mass"):
        assert 0.0 <= summary[key] <= 1.0


def test_a_saved_tiny_model_reloads_with_a_tokenizer_that_keeps_the_spaces(tmp_path):
    # transformers 5's AutoTokenizer would load this folder with Qwen2's byte-level decoder:
    # "Action:Alderrepair()", an invalid action for every answer of a trained tiny model
    from algorithms.llm.model.tiny import build_tiny, load_tokenizer
    from envs.text_watch_repair import parse_action

    model, tokenizer = build_tiny(0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    ids = tokenizer("Action: Alder repair()", add_special_tokens=False)["input_ids"]
    assert parse_action(loaded.decode(ids)) == "repair"
    assert loaded.decode(ids) == tokenizer.decode(ids)


def test_refused_llm_commands_leave_nothing_and_the_corrected_command_then_runs(tmp_path, capsys):
    """`--iterations 0`, a model path that is not there, a folder that is no model and `--resume` without a
    checkpoint used to fail after config.yml / loop_config.yml were written, so that the corrected command
    was refused as "already holds a run"."""
    from algorithms.train import main

    log_dir = tmp_path / "run"
    (tmp_path / "empty_model").mkdir()
    base = ["--algo", "loop", "--env", "TextWatchRepair-v0", "--no-progress", "--log-dir", str(log_dir)]
    small = ["--hyperparams", *SMALL, "env_kwargs={max_turns: 2}", "max_turns=2"]
    refused = [
        (["--model", "tiny-random", "--iterations", "0"], "iterations=0"),
        (["--model", str(tmp_path / "no_such_model"), "--iterations", "1"], "no such directory"),
        (["--model", str(tmp_path / "empty_model"), "--iterations", "1"], "could not be loaded"),
        (["--model", "tiny-random", "--iterations", "1", "--resume"], "no complete checkpoint"),
    ]
    for flags, needle in refused:
        assert main([*base, *flags, *small]) == 2, flags
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
        assert not log_dir.exists(), flags
    assert main([*base, "--model", "tiny-random", "--iterations", "1", *small]) == 0
    assert (log_dir / "summary.json").is_file() and (log_dir / "loop_config.yml").is_file()


def test_a_folder_that_is_no_model_is_one_line_for_training_and_for_evaluation_alike(tmp_path):
    from algorithms.common.errors import VcbmGymError
    from algorithms.evaluate import load_model
    from algorithms.llm.build import model_and_tokenizer

    (tmp_path / "empty_model").mkdir()
    name = str(tmp_path / "empty_model")
    with pytest.raises(VcbmGymError, match=r"could not be loaded .*; expected 'tiny' or a local path / hub name$"):
        model_and_tokenizer(name, 0, False)
    with pytest.raises(VcbmGymError, match=r"could not be loaded .*; expected scripted:\.\.\., tiny, or a model path/name$"):
        load_model(name, 0, None)


def test_the_per_process_batch_is_derived_from_the_rollouts_and_the_world_size():
    from algorithms.llm.resolve import share_batch

    zoo = {"generation_batch_size": 16, "num_generations": 4}
    for world_size, per_device in ((1, 16), (2, 8), (4, 4), (16, 1)):
        mapping = dict(zoo)
        share_batch(mapping, world_size, "vcbm-loop")
        assert mapping["per_device_train_batch_size"] == per_device
    with pytest.raises(ConfigError, match=r"generation_batch_size=16 .* 3 processes \(WORLD_SIZE=3\); expected a multiple of 3"):
        share_batch(dict(zoo), 3, "vcbm-loop")
    named = {**zoo, "per_device_train_batch_size": 16}
    share_batch(named, 1, "loop")
    assert named["per_device_train_batch_size"] == 16  # a named per-process batch is kept
    with pytest.raises(ConfigError, match=r"per_device_train_batch_size=16 x 2 processes .* expected a multiple of 32"):
        share_batch(named, 2, "loop")
    unset = {"num_generations": 4}  # trl-grpo without a rollout count: TRL derives it from the per-process batch
    share_batch(unset, 2, "trl-grpo")
    assert "per_device_train_batch_size" not in unset


def test_the_zoo_entry_resolves_to_the_same_batch_on_one_process_as_before():
    """Dropping per_device_train_batch_size from the zoo keeps one-process runs (and their config hashes) as they were."""
    from algorithms.train import resolve_argv

    for algo in ("loop", "vcbm-loop", "trl-grpo"):
        hp = resolve_argv(["--algo", algo, "--env", "TextWatchRepair-v0"]).hyperparams
        assert (hp["generation_batch_size"], hp["per_device_train_batch_size"]) == (16, 16), algo
