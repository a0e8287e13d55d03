"""Environments of vcbm-gym. They know nothing of the algorithms that train on them."""
