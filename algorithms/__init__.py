"""Agents, trainers and command-line entry points (`train`, `compare`, `evaluate`)."""
