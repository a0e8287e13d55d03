"""Example credit rules for vcbm-gym, registered by this distribution's entry points (pyproject.toml)."""
