"""`python -m algorithms.suite`: the command lives in algorithms/experiment/suite.py (the experiment floor);
this module keeps the command's name and re-exports what importers of `algorithms.suite` use."""

import sys

from algorithms.experiment.suite import build_parser, main, protocol_settings, run, table_markdown

__all__ = ["build_parser", "main", "protocol_settings", "run", "table_markdown"]

if __name__ == "__main__":
    sys.exit(main())
