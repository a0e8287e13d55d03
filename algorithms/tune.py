"""`python -m algorithms.tune`: the command lives in algorithms/experiment/tune.py (the experiment floor);
this module keeps the command's name and re-exports what importers of `algorithms.tune` use."""

import sys

from algorithms.experiment.tune import build_parser, main, resolve_settings, run

__all__ = ["build_parser", "main", "resolve_settings", "run"]

if __name__ == "__main__":
    sys.exit(main())
