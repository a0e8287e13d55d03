"""Two roles in one model (`--algo ccpo`): the role schedule and config, the trainer that plays Thinker and Solver,
and the runner that checks and trains such a run."""
