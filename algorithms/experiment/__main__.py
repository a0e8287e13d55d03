"""`python -m algorithms.experiment ...`: the experiment engine (algorithms.experiment.engine)."""

import sys

from algorithms.experiment.engine import main

sys.exit(main())
