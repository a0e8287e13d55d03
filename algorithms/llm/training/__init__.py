"""Training on played episodes: where credit enters. The EpisodeBatch a credit rule reads (batch.py), the rule's
per-token advantages and the loss (loop.py, loss.py), the continuations a branch-based rule asks for (branches.py),
and the trainers' passes, metrics and checkpoint additions."""
