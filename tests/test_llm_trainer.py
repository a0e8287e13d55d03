"""The LLM arm: prompt truncation, multi-turn rollouts, and LOOP / VCBM-LOOP training end to end on CPU."""

import json

import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import gymnasium as gym  # noqa: E402

import vcbm_gym  # noqa: E402, F401
from algorithms.common.errors import ConfigError, VcbmGymError  # noqa: E402
from algorithms.llm.generation.prompting import BLANKED, initial_messages, prompt_chars, truncate_messages  # noqa: E402
from algorithms.llm.generation.rollout import Episode, hf_generate, play_episodes  # noqa: E402
from algorithms.llm.model.tiny import build_tiny  # noqa: E402
from algorithms.llm.training.batch import episode_batch  # noqa: E402
from algorithms.train import run  # noqa: E402
from tests.helpers import tiny_llm_argv  # noqa: E402
from vcbm_gym.credit.loo import LeaveOneOutRule  # noqa: E402
from vcbm_gym.credit.vcbm_blend import VCBMBlendRule  # noqa: E402

LOGGED_METRICS = (
    "loop/mean_return",
    "loop/task_goal_completion",
    "loop/max_importance_weight",
    "loop/max_logprob_diff",
    "loop/kl_estimate",
    "loop/outlier_gradient_events",
    "loop/mean_output_tokens",
    "loop/return_per_1k_tokens",
)


def _conversation(n_blocks, obs_len):
    msgs = initial_messages("the task " * 10)
    for i in range(n_blocks):
        msgs += [{"role": "assistant", "content": f"Action: wait() {i}"}, {"role": "user", "content": f"obs{i} " + "x" * obs_len}]
    return msgs


def test_truncation_applies_its_three_stages_in_order():
    short = _conversation(3, 100)
    assert truncate_messages(short, 20_000) == short
    # stage 1 suffices: 10 observations of 3,000 chars; blanking all but the last 2 leaves ~6,000 + head
    out = truncate_messages(_conversation(10, 3_000), 20_000)
    users = [m["content"] for m in out[2:] if m["role"] == "user"]
    assert users[:8] == [BLANKED] * 8 and users[8].startswith("obs8") and len(users[9]) > 3_000
    # stage 2: the two kept observations are too long alone -> cut to 2,000 chars (+ a marker)
    out = truncate_messages(_conversation(4, 15_000), 20_000)
    assert all(len(m["content"]) < 2_100 for m in out[2:] if m["role"] == "user")
    assert len(out) == len(_conversation(4, 15_000))
    # stage 3: many blocks, even blanked and cut, still too long -> the oldest blocks go first
    msgs = _conversation(1500, 10)
    out = truncate_messages(msgs, 20_000)
    assert prompt_chars(out) <= 20_000 and out[:2] == msgs[:2] and out[-1] == msgs[-1]
    assert "1499" in out[-2]["content"] and len(out) < len(msgs)


def test_rollout_masks_env_tokens_and_keeps_turn_records():
    model, tok = build_tiny(0)
    envs = [gym.make("TextWatchRepair-v0") for _ in range(2)]
    episodes = play_episodes(lambda c: hf_generate(model, tok, c, 12, 1.0), tok, envs, [7, 7], max_turns=6)
    for e in episodes:
        n = len(e.completion_ids)
        assert len(e.env_mask) == len(e.logprobs) == len(e.turn_ids) == n
        assert len(e.state_mutating) == len(e.turn_texts) == len(e.effects) == 6
        assert e.turn_ids == sorted(e.turn_ids) and set(e.turn_ids) == set(range(6))
        assert sum(e.state_mutating) <= 1  # only the first repair()/skip() mutates state
        env_text = tok.decode([t for t, m in zip(e.completion_ids, e.env_mask) if m == 0])
        assert "Turn 2 of 6" in env_text and "<|im_start|> user" in env_text
        assert all(lp <= 0.0 for lp, m in zip(e.logprobs, e.env_mask) if m == 1)
        assert e.final_text.startswith(e.turn_texts[-1][:20]) and "episode is over" in e.final_text
    # the same seed is the same task: identical first observation and prompt
    assert episodes[0].prompt_ids == episodes[1].prompt_ids


def test_episode_batch_feeds_the_credit_rules():
    e1 = Episode(
        task_seed=3,
        prompt_ids=[1],
        completion_ids=[5, 6, 9, 9, 7, 8],
        env_mask=[1, 1, 0, 0, 1, 1],
        turn_ids=[0, 0, 0, 0, 1, 1],
        state_mutating=[True, False],
        turn_texts=["repair() done", "wait"],
        final_text="over",
        episode_return=2.0,
    )
    e2 = Episode(
        task_seed=3,
        prompt_ids=[1],
        completion_ids=[5, 9, 7],
        env_mask=[1, 0, 1],
        turn_ids=[0, 0, 1],
        state_mutating=[False, False],
        turn_texts=["a", "b"],
        final_text="over",
        episode_return=-1.0,
    )
    batch = episode_batch([e1, e2], 6)
    np.testing.assert_array_equal(batch.returns, [2.0, -1.0])
    assert batch.rewards[0, 5] == 2.0 and batch.rewards[1, 2] == -1.0
    np.testing.assert_array_equal(batch.step_turn[1], [0, 0, 1, -1, -1, -1])
    np.testing.assert_allclose(LeaveOneOutRule().advantages(batch)[0], [3, 3, 0, 0, 3, 3])
    # one bookmark per episode at most: paper rule -> LOO; "retrieve" -> 1 on turn 0, 0.05 on turn 1
    np.testing.assert_allclose(VCBMBlendRule().advantages(batch), LeaveOneOutRule().advantages(batch))
    w = VCBMBlendRule(few_bookmarks="retrieve").token_weights(batch)[0]
    np.testing.assert_allclose(w, np.array([1, 1, 0, 0, 0.05, 0.05]) * 4 / 2.1)


def _one_line_config_error(argv, *fragments):
    with pytest.raises(ConfigError) as excinfo:
        run(["--env", "TextWatchRepair-v0", "--no-progress", *argv])
    message = str(excinfo.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_the_earlier_credit_keys_are_refused_with_the_new_ones_named():
    _one_line_config_error(["--algo", "loop", "--hyperparams", "credit=vcbm"], "credit='vcbm'", "credit: vcbm_blend")
    _one_line_config_error(
        ["--algo", "vcbm-loop", "--hyperparams", "vcbm_beta=0.5", "vcbm_top_k=3"],
        "vcbm_beta, vcbm_top_k",
        "credit_kwargs: {vcbm_blend: {beta: 0.5, top_k: 3}}",
    )
    _one_line_config_error(["--algo", "loop", "--credit", "vcbm_bookmark"], "'vcbm_bookmark'", "observations")
    _one_line_config_error(["--algo", "loop", "--credit", "nope"], "unknown credit rule 'nope'", "gigpo")
    _one_line_config_error(["--algo", "trl-grpo", "--credit", "grpo"], "trl-grpo keeps TRL's own group advantage")
    _one_line_config_error(
        ["--algo", "loop", "--credit", "grpo", "--hyperparams", "credit_kwargs={grpo: {eps: -1}}"], "credit rule 'grpo'", "eps=-1"
    )


def test_casi_is_refused_at_start_up_naming_what_it_needs():
    _one_line_config_error(
        ["--algo", "loop", "--credit", "casi"], "credit rule 'casi' needs extras['coalition_values']", "llm arm does not provide"
    )


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


LORA_SMALL = [
    "finetune=lora",
    "max_new_tokens_per_turn=16",
    "generation_batch_size=8",
    "per_device_train_batch_size=8",
    "one_shot=true",
]


def _lora_b_norm(adapter_dir):
    from safetensors.torch import load_file

    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return sum(float(v.abs().sum()) for k, v in weights.items() if "lora_B" in k)


@pytest.mark.slow
def test_vcbm_loop_trains_logs_and_resumes_to_the_same_metrics(tmp_path):
    # the LoRA path (as for a real model) on the untrained tiny model; its random answers still name tools
    def vcbm_loop(log_dir, *extra, iterations=3):
        return run(
            tiny_llm_argv("vcbm-loop", log_dir, "--checkpoint-every", "1", *extra, iterations=iterations, hyperparams=LORA_SMALL)
        )

    full = vcbm_loop(tmp_path / "full")
    assert full["iterations_run"] == 3 and full["memory_size"] > 0
    assert _lora_b_norm(tmp_path / "full" / "adapter") > 0  # LoRA B starts at 0: only gradients move it
    scalars = _scalars(tmp_path / "full")
    for tag in LOGGED_METRICS:
        assert [step for step, _ in scalars[tag]] == [1, 2, 3], tag
    assert scalars["loop/max_importance_weight"][-1][1] >= 1.0
    # the trainer's log-probs of the generated tokens match the rollout's: the sequence is built right
    assert full["final_max_sampling_logprob_diff"] < 1e-4

    # the same run killed after iteration 2's checkpoint (what a kill leaves: no later checkpoint, no
    # summary), then resumed: it ends with exactly the same metrics
    import shutil

    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "full", killed)
    shutil.rmtree(killed / "checkpoints" / "checkpoint-6")
    for name in ("summary.json", "history.json"):
        (killed / name).unlink()
    (killed / "checkpoints" / "checkpoint-99").mkdir()  # cut short before its files: never resumed from
    broken = tmp_path / "broken"
    shutil.copytree(killed, broken)
    resumed = vcbm_loop(killed, "--resume")
    assert resumed["resumed_from"].endswith("checkpoint-4")
    finals = {k: v for k, v in full.items() if k.startswith("final_")}
    assert finals and finals == {k: v for k, v in resumed.items() if k.startswith("final_")}
    assert json.loads((killed / "summary.json").read_text())["final_iteration"] == 3
    # a checkpoint whose episodic memory holds NaN (or is cut short) is refused with one line
    memory_file = broken / "checkpoints" / "checkpoint-4" / "credit_state.npz"
    with np.load(memory_file) as data:
        memory = {k: data[k] for k in data.files}
    memory["memory/returns"] = np.full_like(memory["memory/returns"], np.nan)
    np.savez(memory_file, **memory)
    with pytest.raises(VcbmGymError, match="unreadable credit-rule state"):
        vcbm_loop(broken, "--resume")
    # config.yml records the flags that ran, and a different budget is another config: refused
    import yaml

    recorded = yaml.safe_load((killed / "config.yml").read_text())["hyperparams"]
    assert recorded["model"] == "tiny-random" and recorded["iterations"] == 3 and recorded["checkpoint_every"] == 1
    with pytest.raises(Exception, match="another config"):
        vcbm_loop(killed, "--resume", iterations=4)
    # and rerunning from that config.yml alone (no flags) gives the same run
    again = run(
        [
            "--algo",
            "vcbm-loop",
            "--env",
            "TextWatchRepair-v0",
            "--config",
            str(killed / "config.yml"),
            "--no-progress",
            "--log-dir",
            str(tmp_path / "again"),
        ]
    )
    assert {k: v for k, v in again.items() if k.startswith("final_")} == finals


@pytest.mark.slow
def test_high_kl_abort_discards_the_iteration(tmp_path):
    summary = run(tiny_llm_argv("loop", tmp_path, hyperparams=["kl_abort=1.0e-12", *LORA_SMALL]))
    # the first epoch moves the weights, the second sees KL > threshold: the iteration is undone
    assert summary["final_iteration_aborted"] == 1.0 and summary["final_aborted_iterations"] == 1.0
    assert summary["final_kl_estimate"] > 1e-12
    assert summary["finetune"] == "lora" and summary["trained_weight_change_l2"] == 0.0
    assert _lora_b_norm(tmp_path / "adapter") == 0.0


def test_scripted_rollout_records_the_decision_and_truncates_only_the_model_context():
    _, tok = build_tiny(0)
    answers = iter(["Thought : fix it Action : repair ( )"] + ["Action : wait ( )"] * 5)
    seen = []

    def scripted(contexts):
        seen.append(len(contexts[0]))
        ids = tok(next(answers), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return [(ids, [-0.5] * len(ids))]

    env = gym.make("TextWatchRepair-v0")
    (e,) = play_episodes(scripted, tok, [env], [11], max_turns=6, truncation_chars=1_200)
    assert e.state_mutating == [True] + [False] * 5
    assert e.effects == ["repair"] + ["wait"] * 5
    assert "repair() done" in e.turn_texts[0] and "bumps" in e.turn_texts[1]
    # past 1,200 characters the model sees the truncated conversation; the training sequence keeps all
    truncated = 0
    for t in range(6):
        untruncated = len(e.prompt_ids) + e.turn_ids.index(t)  # the sequence up to turn t's answer
        if prompt_chars(e.messages[: 2 + 2 * t]) > 1_200:
            assert seen[t] < untruncated
            truncated += 1
        else:
            assert seen[t] == untruncated
    assert 0 < truncated < 6
    generated = [t for t, m in zip(e.completion_ids, e.env_mask) if m == 1]
    assert tok.decode(generated).count("wait") == 5 and e.logprobs.count(-0.5) == len(generated)


def test_rollouts_of_one_task_draw_their_own_outcomes_when_given_outcome_seeds():
    """K rollouts of a task share its prompt; with outcome seeds the same decision meets independent returns."""
    _, tok = build_tiny(0)
    repair = tok("Action : repair ( )", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def scripted(contexts):
        return [(repair, [-0.5] * len(repair))] * len(contexts)

    def group(outcome_seeds):
        envs = [gym.make("TextWatchRepair-v0", max_turns=2) for _ in range(4)]
        return play_episodes(scripted, tok, envs, [11] * 4, max_turns=2, outcome_seeds=outcome_seeds)

    shared, own = group(None), group([1, 2, 3, 4])
    assert len({tuple(e.prompt_ids) for e in shared + own}) == 1
    assert len({e.episode_return for e in shared}) == 1  # the task seed fixes the outcome: one draw for all K
    assert len({e.episode_return for e in own}) == 4
    assert [e.episode_return for e in group([1, 2, 3, 4])] == [e.episode_return for e in own]
    with pytest.raises(ValueError, match="3 outcome seeds for 4 task seeds"):
        group([1, 2, 3])


def test_outcome_seeds_go_only_to_envs_that_take_them():
    from algorithms.llm.generation.rollout import takes_outcome_seed

    assert takes_outcome_seed(gym.make("TextWatchRepair-v0")) and takes_outcome_seed(gym.make("TextWatchWorkshop-v0"))
    from envs.appworld.env import AppWorldEnv

    # AppWorld refuses reset options it does not know: it must never be sent one
    assert not takes_outcome_seed(AppWorldEnv.__new__(AppWorldEnv))

    from envs.text_watch_repair import TextWatchRepairEnv

    class NoResetOptions(TextWatchRepairEnv):
        metadata = {"render_modes": ["ansi"], "render_fps": 1}

        def reset(self, *, seed=None, options=None):
            assert options is None, options
            return super().reset(seed=seed)

    _, tok = build_tiny(0)
    answer = tok("Action : skip ( )", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    envs = [NoResetOptions(max_turns=2), gym.make("TextWatchRepair-v0", max_turns=2)]
    episodes = play_episodes(lambda c: [(answer, [-0.5] * len(answer))] * len(c), tok, envs, [3, 3], 2, outcome_seeds=[1, 2])
    assert [e.done for e in episodes] == [True, True]


def test_the_trainer_gives_each_rollout_its_own_outcome_seed_fixed_by_seed_step_and_process():
    from types import SimpleNamespace

    from algorithms.llm.training.trainer import MultiTurnGRPOTrainer

    def seeds(step, process=0, shared=False, n=48):
        trainer = SimpleNamespace(
            args=SimpleNamespace(seed=0, shared_outcomes=shared),
            state=SimpleNamespace(global_step=step),
            accelerator=SimpleNamespace(process_index=process),
        )
        return MultiTurnGRPOTrainer._outcome_seeds(trainer, n)

    batch = seeds(4)
    assert len(set(batch)) == 48 and batch == seeds(4)  # one per rollout; a resume at that step draws them again
    assert not set(batch) & set(seeds(6)) and not set(batch) & set(seeds(4, process=1))  # new draws per batch, per rank
    assert seeds(4, shared=True) is None  # shared_outcomes: the task seed fixes the outcome


@pytest.mark.slow
def test_empo_effect_ratio_sharing_smoke_run_logs_cell_coverage(tmp_path):
    # K = 24 rollouts of one task share the turn-0 prompt; equal parsed actions there form EMPO cells
    # (the random tiny model names one of the 4 tools in some of its 32-token turns). One micro-batch keeps
    # cells whole.
    batch = ["num_generations=24", "generation_batch_size=24", "per_device_train_batch_size=24", "max_new_tokens_per_turn=32"]
    summary = run(tiny_llm_argv("loop", tmp_path, "--ratio-sharing", "effect", hyperparams=batch))
    coverage = _scalars(tmp_path)["loop/empo_cell_coverage"]
    assert [step for step, _ in coverage] == [1]
    assert 0.0 < coverage[0][1] <= 1.0
    assert summary["final_empo_cell_coverage"] == pytest.approx(coverage[0][1], rel=1e-6)  # TensorBoard stores float32
