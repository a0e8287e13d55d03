"""`python -m algorithms.credit_reference`."""

import sys

from algorithms.credit_reference.cli import main

if __name__ == "__main__":
    sys.exit(main())
