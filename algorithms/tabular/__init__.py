"""Tabular agents for WatchRepair: VCBM, RUDDER, Monte Carlo, Q-learning."""
