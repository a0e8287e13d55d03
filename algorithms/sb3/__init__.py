"""Stable-Baselines3 agents (PPO, A2C, DQN) whose credit assignment is a pluggable CreditRule."""
