"""Credit-assignment rules: pure functions and small classes over arrays, no I/O."""
