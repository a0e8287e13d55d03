"""`python -m algorithms.plot`: the command lives in algorithms/experiment/plot.py (the experiment floor);
this module keeps the command's name and re-exports what importers of `algorithms.plot` use."""

import sys

from algorithms.experiment.plot import build_parser, learning_curves, main, plot_learning_curves, run

__all__ = ["build_parser", "learning_curves", "main", "plot_learning_curves", "run"]

if __name__ == "__main__":
    sys.exit(main())
