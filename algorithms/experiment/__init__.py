"""The experiment commands, which run many runs: compare (Table II, Figure 1), tune (Optuna), suite (bsuite
sweeps) and plot (learning curves across seeds), with what they share: the jobs of resolved runs (jobs.py),
the executor that runs them in processes or on Ray (executor.py, distributed.py), the statistics (stats.py)
and the writing of a results directory (results.py).

The top floor of the import graph (tests/test_layers.py): it imports the commands that run one thing
(`algorithms.train`), the registry and its arms, never the other way round. A run is resolved once per
algo in memory (`train.resolve_spec`, a RunSpec) and a worker trains it with `train.execute`: no command
line is built or parsed after the experiment command's own.
"""
