"""The LLM arm's rollout metrics: an invalid turn is one whose answer executed nothing, in either of the contract's
spellings (None, the TextWorld games'; "invalid", the embedded envs')."""

from algorithms.llm.training.metrics import rollout_metrics


def _part(effects, returns, optimal=()):
    return {
        "returns": returns, "generated": [4] * len(returns), "token_bound": [False] * len(returns),
        "turn_effects": effects, "optimal_turns": list(optimal), "last_infos": [{}] * len(returns),
        "mass": [0.0, 0.0], "tokens": [1.0, 8.0],
    }  # fmt: skip


def test_the_invalid_turn_rate_counts_none_and_invalid_effects_over_every_process():
    textworld = _part([None, "move north", "take coin", None], [0.0, 1.0])  # TextWorld: None for an invalid answer
    embedded = _part(["invalid", "repair", "skip", "inspect"], [1.0, 1.0])  # the embedded envs: "invalid"
    metrics = rollout_metrics([textworld, embedded])
    assert metrics["invalid_turn_rate"] == 3 / 8
    assert metrics["mean_return"] == 0.75
    assert rollout_metrics([_part(["move north"], [0.0])])["invalid_turn_rate"] == 0.0


def test_the_optimal_action_rate_counts_the_turns_of_every_process_that_report_it():
    sokoban = _part(["push up", "move left", "invalid"], [1.0], optimal=[True, False, False])
    other = _part(["move down"], [0.0], optimal=[True])
    assert rollout_metrics([sokoban, other])["optimal_action_rate"] == 0.5
    assert "optimal_action_rate" not in rollout_metrics([_part(["repair"], [1.0])])  # the env reports no action_optimal
