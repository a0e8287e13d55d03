"""The tiny models that stand in for an instruct model on CPU: built from scratch (tiny.py) or format-warm-started
by a short supervised stage (warm_start.py)."""
