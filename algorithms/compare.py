"""`python -m algorithms.compare`: the command lives in algorithms/experiment/compare.py (the experiment floor);
this module keeps the command's name and re-exports what importers of `algorithms.compare` use."""

import sys

from algorithms.experiment.compare import aggregate, build_parser, main, make_jobs, run, table_markdown

__all__ = ["aggregate", "build_parser", "main", "make_jobs", "run", "table_markdown"]

if __name__ == "__main__":
    sys.exit(main())
