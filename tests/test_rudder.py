"""RUDDER (docs/papers/vcbm.md, "RUDDER"): the gate-less cell, featurisation, loss, lesson buffer,
schedule, redistribution, and the rule on a classic-control env's own features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.watch_repair import WatchRepairFeaturizer
from tests.helpers import make_batch
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.features import SpaceFeaturizer
from vcbm_gym.credit.rudder import (
    PARAMETER_NAMES,
    AdamState,
    GatelessLSTM,
    LessonBuffer,
    RudderCreditConfig,
    RudderRule,
    adam_step,
    loss_and_gradients,
    parameter_arrays,
    redistribute,
    rudder_loss,
    train_until_converged,
)

WATCH = WatchRepairFeaturizer(horizon=50)  # the paper's task: 10 features


def featurize(observations, actions, horizon=50):
    return WatchRepairFeaturizer(horizon=horizon)(observations, actions)


def rule(**kwargs) -> RudderRule:
    return RudderRule(WATCH, **kwargs)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _small_model() -> GatelessLSTM:
    """2 features, 2 units, hand-set weights."""
    model = GatelessLSTM(n_features=2, hidden_size=2).double()
    with torch.no_grad():
        model.cell_input.weight.copy_(torch.tensor([[1.0, -0.5], [0.3, 2.0]], dtype=torch.float64))
        model.cell_input.bias.copy_(torch.tensor([0.1, -0.2], dtype=torch.float64))
        model.recurrent_gate.weight.copy_(torch.tensor([[2.0, 0.0], [-1.0, 0.5]], dtype=torch.float64))
        model.gate_bias.copy_(torch.tensor([-3.0, -1.0], dtype=torch.float64))
        model.readout.weight.copy_(torch.tensor([[1.5, -2.0]], dtype=torch.float64))
        model.readout.bias.copy_(torch.tensor([0.25], dtype=torch.float64))
    return model


def test_gateless_cell_matches_a_hand_computation_on_three_steps():
    x = [[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]]
    W, b = [[1.0, -0.5], [0.3, 2.0]], [0.1, -0.2]
    R, b_i = [[2.0, 0.0], [-1.0, 0.5]], [-3.0, -1.0]
    c = [0.0, 0.0]
    expected_cells, expected_predictions = [], []
    for x_t in x:
        z = [math.tanh(W[h][0] * x_t[0] + W[h][1] * x_t[1] + b[h]) for h in range(2)]
        gate = [_sigmoid(R[h][0] * c[0] + R[h][1] * c[1] + b_i[h]) for h in range(2)]  # from h_{t-1} = c_{t-1} only
        c = [c[h] + gate[h] * z[h] for h in range(2)]  # no forget gate
        expected_cells.append(c)
        expected_predictions.append(1.5 * c[0] - 2.0 * c[1] + 0.25)  # identity output h_t = c_t
    model = _small_model()
    features = torch.tensor([x], dtype=torch.float64)
    np.testing.assert_allclose(model.cell_states(features)[0].detach().numpy(), expected_cells, rtol=1e-12)
    np.testing.assert_allclose(model.cell_states_autograd(features)[0].detach().numpy(), expected_cells, rtol=1e-12)
    np.testing.assert_allclose(model(features)[0].detach().numpy(), expected_predictions, rtol=1e-12)
    # Numbers written out for the first step: z = tanh(1.1), tanh(0.1); gate = sigmoid(-3), sigmoid(-1).
    assert expected_cells[0][0] == pytest.approx(_sigmoid(-3.0) * math.tanh(1.1))


def test_hand_written_bptt_equals_autograd():
    torch.manual_seed(0)
    model = GatelessLSTM(n_features=10, hidden_size=16, seed=4).double()
    with torch.no_grad():
        model.gate_bias.normal_()  # gates away from saturation so every path matters
        model.recurrent_gate.weight.mul_(5.0)
    features = torch.randn(3, 7, 10, dtype=torch.float64)
    weights = torch.randn(3, 7, 16, dtype=torch.float64)
    params = [model.cell_input.weight, model.cell_input.bias, model.recurrent_gate.weight, model.gate_bias]
    fast = torch.autograd.grad((model.cell_states(features) * weights).sum(), params)
    reference = torch.autograd.grad((model.cell_states_autograd(features) * weights).sum(), params)
    for got, want in zip(fast, reference):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


def test_initialisation_follows_the_spec():
    model = GatelessLSTM(n_features=10, hidden_size=16, seed=0)
    assert torch.all(model.gate_bias == -3.0)
    weights = torch.cat([model.cell_input.weight.flatten(), model.recurrent_gate.weight.flatten()])
    assert abs(weights.std().item() - 0.1) < 0.02  # 416 draws of N(0, 0.1): sd of the sd ~0.0035
    assert GatelessLSTM(10, seed=0).cell_input.weight.equal(model.cell_input.weight)


def test_featurize_uses_differences_one_hot_brand_time_and_action():
    # [flag, counter1, counter2, brand, t] over 3 steps of a brand-2 episode that repairs at t = 0.
    obs = np.array([[0, 0, 0, 2, 0], [1, 1, 0, 2, 1], [1, 1, 1, 2, 2]])
    actions = np.array([0, 1, 1])
    got = featurize(obs, actions, horizon=50)
    expected = np.array(
        [
            [0, 0, 0, 0, 0, 1, 0, 0.0, 1, 0],  # first step raw: brand one-hot, t / T = 0
            [1, 1, 0, 0, 0, 0, 0, 0.02, 0, 1],
            [0, 0, 1, 0, 0, 0, 0, 0.02, 0, 1],
        ],
        dtype=np.float32,
    )
    np.testing.assert_allclose(got, expected, atol=1e-7)
    assert featurize(obs[None], actions[None], horizon=50).shape == (1, 3, 10)
    with pytest.raises(ValueError, match="brand"):
        featurize(np.array([[0, 0, 0, 7, 0]]), np.array([0]), horizon=50)


@pytest.mark.parametrize(
    "obs_space, act_space",
    [
        (spaces.Box(-2.0, 2.0, (4,), np.float32), spaces.Discrete(2)),
        (spaces.MultiDiscrete([2, 5, 3], start=[0, 1, -1]), spaces.Discrete(3, start=1)),
        (spaces.Discrete(4), spaces.Box(-1.0, 1.0, (2,), np.float32)),
        (spaces.MultiBinary(3), spaces.MultiDiscrete([2, 3])),
    ],
)
def test_space_featurizer_is_gymnasiums_flatten_per_step(obs_space, act_space):
    obs_space.seed(0), act_space.seed(1)
    obs = np.array([[obs_space.sample() for _ in range(5)] for _ in range(3)])
    acts = np.array([[act_space.sample() for _ in range(5)] for _ in range(3)])
    featurizer = SpaceFeaturizer(obs_space, act_space)
    got = featurizer(obs, acts)
    assert got.shape == (3, 5, featurizer.n_features) and got.dtype == np.float32
    for b in range(3):
        for t in range(5):
            want = np.concatenate([spaces.flatten(obs_space, obs[b, t]), spaces.flatten(act_space, acts[b, t])])
            np.testing.assert_allclose(got[b, t], want.astype(np.float32))
    diffs = SpaceFeaturizer(obs_space, act_space, differences=True)(obs, acts)
    np.testing.assert_allclose(diffs[:, 1:, : spaces.flatdim(obs_space)], np.diff(got[:, :, : spaces.flatdim(obs_space)], axis=1))
    with pytest.raises(TypeError, match="Text"):
        SpaceFeaturizer(spaces.Text(5), act_space)


def test_loss_is_main_plus_half_aux_over_real_steps():
    predictions = torch.tensor([[0.0, 1.0, 3.0], [2.0, 4.0, 9.0]])
    target = torch.tensor([1.0, 2.0])
    lengths = torch.tensor([3, 2])  # the second episode's third step is padding
    loss, main, aux = rudder_loss(predictions, target, lengths, aux_weight=0.5)
    main_hand = ((3.0 - 1.0) ** 2 + (4.0 - 2.0) ** 2) / 2
    aux_hand = (((0 - 1) ** 2 + 0 + (3 - 1) ** 2) / 3 + ((2 - 2) ** 2 + (4 - 2) ** 2) / 2) / 2
    assert main.item() == pytest.approx(main_hand)
    assert aux.item() == pytest.approx(aux_hand)
    assert loss.item() == pytest.approx(main_hand + 0.5 * aux_hand)


def test_numpy_training_step_equals_torch_autograd_and_adam():
    model = GatelessLSTM(n_features=10, hidden_size=16, seed=7).double()
    rng = np.random.default_rng(0)
    features = rng.normal(size=(4, 6, 10))
    lengths = np.array([6, 3, 1, 5])
    targets = rng.normal(size=4)
    main, aux, grads = loss_and_gradients(parameter_arrays(model), features, lengths, targets, aux_weight=0.5)
    predictions = model.readout(model.cell_states_autograd(torch.from_numpy(features))).squeeze(-1)
    loss, main_ref, aux_ref = rudder_loss(predictions, torch.from_numpy(targets), torch.from_numpy(lengths), 0.5)
    loss.backward()
    assert main == pytest.approx(main_ref.item(), rel=1e-12) and aux == pytest.approx(aux_ref.item(), rel=1e-12)
    named = dict(model.named_parameters())
    for name, grad in zip(PARAMETER_NAMES, grads):
        np.testing.assert_allclose(grad, named[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)

    reference = GatelessLSTM(n_features=10, hidden_size=16, seed=7).double()
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, weight_decay=1e-6)
    state = AdamState.zeros_like(parameter_arrays(model))
    with torch.no_grad():
        model.load_state_dict(reference.state_dict())
    for _ in range(3):
        _, _, grads = loss_and_gradients(parameter_arrays(model), features, lengths, targets, 0.5)
        adam_step(parameter_arrays(model), grads, state, lr=1e-2, weight_decay=1e-6)
        optimizer.zero_grad()
        predictions = reference(torch.from_numpy(features))
        rudder_loss(predictions, torch.from_numpy(targets), torch.from_numpy(lengths), 0.5)[0].backward()
        optimizer.step()
    for name, param in reference.named_parameters():
        np.testing.assert_allclose(
            dict(model.named_parameters())[name].detach().numpy(), param.detach().numpy(), rtol=1e-9, atol=1e-12
        )


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(1, 50),
    brand=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_redistribution_sums_to_scaled_final_prediction(length, brand, seed, data):
    actions = np.array(data.draw(st.lists(st.integers(0, 1), min_size=length, max_size=length)))
    rng = np.random.default_rng(seed)
    obs = np.zeros((length, 5), dtype=np.int64)
    obs[:, 0] = np.arange(length) > 0 if actions[0] == 0 else 0
    obs[:, 1:3] = np.cumsum(rng.random((length, 2)) < [0.1, 0.05], axis=0)
    obs[:, 3] = brand
    obs[:, 4] = np.arange(length)
    model = GatelessLSTM(10, seed=seed)
    with torch.no_grad():
        model.readout.bias.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed))
    features = featurize(obs, actions, horizon=50)
    rewards = redistribute(model, features, reward_scale=10.0)
    g_hat = model(torch.from_numpy(features)[None])[0].detach().double().numpy()
    assert rewards.shape == (length,)
    assert rewards.sum() == pytest.approx(10.0 * g_hat[-1], rel=1e-9, abs=1e-9)
    assert rewards[0] == pytest.approx(10.0 * g_hat[0], rel=1e-9, abs=1e-9)  # G_hat_{-1} = 0


def test_lesson_buffer_is_fifo_with_capacity():
    buffer = LessonBuffer(capacity=4, max_length=3, n_features=2, seed=0)
    for i in range(6):
        buffer.add(np.full((2, 2), i, dtype=np.float32), float(i))
    assert len(buffer) == 4
    assert sorted(buffer.returns.tolist()) == [2.0, 3.0, 4.0, 5.0]  # the two oldest are gone
    assert buffer.distinct_returns() == 4
    with pytest.raises(ValueError, match="episode features"):
        buffer.add(np.zeros((4, 3), dtype=np.float32), 0.0)  # 3 features, not 2


def test_lesson_buffer_grows_to_the_longest_episode_and_cuts_batches_to_theirs():
    buffer = LessonBuffer(capacity=3, max_length=1, n_features=1, seed=0)
    buffer.add(np.ones((2, 1), dtype=np.float32), 1.0)
    features, lengths, _ = buffer.sample(4)
    assert features.shape == (4, 2, 1) and set(lengths.tolist()) == {2}
    buffer.add(np.full((5, 1), 2.0, dtype=np.float32), 2.0)  # longer than any row so far
    assert buffer.features.shape == (3, 5, 1)
    np.testing.assert_array_equal(buffer.features[0, :, 0], [1, 1, 0, 0, 0])  # the first episode, padded
    np.testing.assert_array_equal(buffer.features[1, :, 0], [2, 2, 2, 2, 2])
    features, lengths, returns = buffer.sample(50)
    assert features.shape == (50, 5, 1) and set(lengths.tolist()) == {2, 5}
    np.testing.assert_array_equal(lengths, np.where(returns == 1.0, 2, 5))


def test_lesson_buffer_samples_uniformly_and_reproducibly():
    def filled(seed: int) -> LessonBuffer:
        buffer = LessonBuffer(capacity=10, max_length=1, n_features=1, seed=seed)
        for i in range(10):
            buffer.add(np.array([[i]], dtype=np.float32), float(i))
        return buffer

    a, b = filled(3), filled(3)
    batches_a = [a.sample(8)[2] for _ in range(5)]
    assert all(np.array_equal(x, b.sample(8)[2]) for x in batches_a)
    features, lengths, returns = a.sample(8)
    assert features.shape == (8, 1, 1) and lengths.shape == (8,) and np.array_equal(features[:, 0, 0], returns)
    draws = np.concatenate([a.sample(8)[2] for _ in range(2500)])  # 20,000 draws over 10 slots
    counts = np.bincount(draws.astype(int), minlength=10)
    # Each count ~ Binomial(20000, 0.1): sd ~42; 5 sd tolerance.
    assert np.all(np.abs(counts - 2000) < 5 * math.sqrt(20000 * 0.1 * 0.9))


def test_training_event_runs_until_the_running_loss_is_low():
    cfg = RudderCreditConfig(max_steps_per_event=500)
    buffer = LessonBuffer(64, 50, WATCH.n_features, seed=0)
    for _ in range(64):
        buffer.add(np.zeros((50, WATCH.n_features), dtype=np.float32), 0.0)  # predictable target 0
    model = GatelessLSTM(WATCH.n_features, seed=0).double()
    adam = AdamState.zeros_like(parameter_arrays(model))
    event = train_until_converged(model, adam, buffer, cfg)
    # The running average restarts at 0.3 and decays by 0.99: at least 69 steps to get below 0.15.
    assert 69 <= event.steps < 500 and not event.capped and event.running_loss < 0.15
    capped = train_until_converged(model, adam, buffer, RudderCreditConfig(max_steps_per_event=5))
    assert capped.steps == 5 and capped.capped


def _episodes(n: int, seed: int, length: int = 50) -> EpisodeBatch:
    """WatchRepair-like episodes: repair at t = 0 for half of them; return paid at the end."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((n, length, 5), dtype=np.int64)
    actions = np.ones((n, length), dtype=np.int64)
    actions[:, 0] = rng.integers(2, size=n)
    brand = rng.integers(4, size=n)
    obs[:, :, 3] = brand[:, None]
    obs[:, :, 4] = np.arange(length)
    obs[:, 1:, 0] = (actions[:, 0] == 0)[:, None]
    rewards = np.zeros((n, length))
    rewards[:, -1] = np.where(actions[:, 0] == 0, rng.normal(brand, 1.0), 0.0)
    return make_batch(rewards, observations=obs, actions=actions)


def test_rule_trains_on_schedule_and_redistributes_afterwards():
    trained = rule(seed=0, max_steps_per_event=30, min_buffer_episodes=40, train_every=25)
    first = _episodes(50, seed=1)
    trained.observe(first)
    assert trained.training_events == 1  # at episode 50: buffer 50 > 40, a multiple of 25
    np.testing.assert_allclose(
        trained.advantages(first).sum(axis=1),
        10.0
        * trained.model(torch.from_numpy(featurize(first.observations, first.actions, 50)).double())[:, -1]
        .detach()
        .double()
        .numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    untrained = rule(seed=0)
    np.testing.assert_array_equal(untrained.advantages(first), first.rewards)  # raw rewards before training
    with pytest.raises(ValueError, match="observations"):
        untrained.observe(EpisodeBatch(rewards=first.rewards, mask=first.mask))


def test_rule_waits_for_distinct_returns():
    waiting = rule(seed=0, min_buffer_episodes=10, train_every=5, max_steps_per_event=5)
    batch = _episodes(30, seed=2)
    flat = EpisodeBatch(
        rewards=np.zeros_like(batch.rewards), mask=batch.mask, observations=batch.observations, actions=batch.actions
    )
    waiting.observe(flat)
    assert waiting.training_events == 0  # one distinct return (0) only
    waiting.observe(batch)
    assert waiting.training_events == 6  # episodes 35, 40, ..., 60


def test_state_dict_round_trip_continues_identically():
    batch, later = _episodes(60, seed=3), _episodes(25, seed=4)
    a = rule(seed=5, min_buffer_episodes=40, max_steps_per_event=20)
    a.observe(batch)
    b = rule(seed=99, min_buffer_episodes=40, max_steps_per_event=20)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.advantages(batch), b.advantages(batch))
    a.observe(later)
    b.observe(later)  # same buffer contents, rng and optimizer moments: the same training event
    np.testing.assert_array_equal(a.advantages(later), b.advantages(later))
    with pytest.raises(ValueError, match="config"):
        rule(seed=0).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="features"):
        RudderRule(
            WatchRepairFeaturizer(horizon=50, n_brands=3), seed=5, min_buffer_episodes=40, max_steps_per_event=20
        ).load_state_dict(a.state_dict())


def test_rule_needs_a_featurizer_and_takes_the_envs_own():
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers the envs)

    with pytest.raises(ValueError, match="featurizer"):
        RudderRule()
    on_watch = RudderRule.from_env(gym.make("WatchRepair-v0"))
    assert isinstance(on_watch.featurizer, WatchRepairFeaturizer) and on_watch.featurizer.n_features == 10
    on_cartpole = RudderRule.from_env(gym.make("DelayedCartPole-v1"))
    assert on_cartpole.featurizer.n_features == 4 + 2  # CartPole's 4 numbers and the one-hot of 2 actions


def test_rudder_agent_trains_through_the_cli(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from algorithms.train import run

    summary = run(
        [
            "--algo",
            "rudder",
            "--seed",
            "1",
            "--max-episodes",
            "120",
            "--no-progress",
            "--log-dir",
            str(tmp_path),
            "--hyperparams",
            "min_buffer_episodes=50",
            "max_steps_per_event=20",
        ]
    )
    assert summary["lstm_training_events"] == 2  # at episodes 75 and 100 (the buffer must exceed 50)
    assert summary["adam_steps_per_event_max"] <= 20
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "rudder/lstm_main_loss",
        "rudder/lstm_aux_loss",
        "rudder/adam_steps_per_event",
        "rudder/redistributed_reward_t0",
    } <= tags


def test_ppo_with_rudder_on_a_delayed_classic_control_env_learns_from_its_observations(tmp_path):
    """`--algo ppo --credit rudder` on DelayedCartPole-v1: the LSTM reads CartPole's 4 numbers and the
    action (6 features, not WatchRepair's 10), trains, and the run reports its return without a
    convergence criterion (CartPole reports no first_decision_optimal)."""
    from algorithms.train import run

    summary = run(
        [
            "--algo", "ppo", "--credit", "rudder", "--env", "DelayedCartPole-v1", "--max-episodes", "60",
            "--no-progress", "--log-dir", str(tmp_path),
            "--hyperparams", "n_steps=512", "batch_size=128", "n_epochs=2",
            "credit_kwargs={rudder: {min_buffer_episodes: 20, train_every: 10, max_steps_per_event: 30}}",
        ]
    )  # fmt: skip
    assert summary["credit_summary"]["n_features"] == 6
    assert summary["credit_summary"]["training_events"] >= 1
    assert summary["episodes_run"] == 60 and summary["converged"] is None and summary["final_correct_rate"] is None
    assert summary["mean_return_last_episodes"] >= 8  # CartPole pays 1 a step and no episode is shorter than 8
