"""DelayedReward: any Gymnasium env as a delayed-reward task.

The wrapper holds back every step's reward and pays the episode's sum at its last step (the step
that terminates or truncates it); every other step pays 0. The return, the observations, the
termination and the `info` are the wrapped env's own, so an agent that maximises the delayed
return maximises the original one: only the timing of the signal changes, which is what the
credit rules are for. Use it outside any TimeLimit (registered envs do, through
`additional_wrappers`), so that a truncation still pays what was earned.

A NaN or infinite reward from the wrapped env is refused at the step that returns it (one-line
`ContractError` naming the step and episode): held back and summed, it would surface only at the
episode's end, as a NaN return with no trace of where it came from.

Every step's `info["withheld_reward"]` is the reward it held back (evaluation only: a reward rule's fit to the
dense reward is scored against it, never learned from).

`envs.snapshot.snapshot(env)` captures the held-back reward with the rest of the wrapper chain.

`vcbm_gym` registers it over classic-control tasks as `Delayed<Name>` (e.g. `DelayedCartPole-v1`).
"""

from __future__ import annotations

import math
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.envs.registration import WrapperSpec

from envs.contract_errors import ContractError, env_name, non_finite_reward_message


class DelayedReward(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Pays an episode's summed reward at its last step and 0 before it."""

    # its state, for envs.snapshot.snapshot(env): the reward held back so far and the error message's counters
    snapshot_fields = ("_pending", "_episode", "_step")

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self._pending = 0.0
        self._episode = 0  # resets so far: the episode and step that a non-finite reward came from
        self._step = 0

    @classmethod
    def wrapper_spec(cls) -> WrapperSpec:
        """The spec to put in `register(..., additional_wrappers=(...,))`."""
        return WrapperSpec(name=cls.__name__, entry_point=f"{cls.__module__}:{cls.__name__}", kwargs={})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._pending = 0.0
        self._episode += 1
        self._step = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._step += 1
        value = float(reward)
        if not math.isfinite(value):
            where = f"step {self._step} of episode {max(self._episode, 1)}"
            raise ContractError(non_finite_reward_message(env_name(self.env), reward, f"{where} (seen by DelayedReward)"))
        self._pending += value
        info = {**info, "withheld_reward": value}
        if terminated or truncated:
            paid: SupportsFloat = self._pending
            self._pending = 0.0
        else:
            paid = 0.0
        return obs, paid, terminated, truncated, info
