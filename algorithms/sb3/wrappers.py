"""Deprecated: the replay buffer moved to algorithms/sb3/buffers.py (SB3 calls these `buffers`).

`EpisodeRedistributionBuffer` is now `RelabelingReplayBuffer`; this module keeps the old names importable for a
deprecation period, with a DeprecationWarning on import.
"""

import warnings

from algorithms.sb3.buffers import RelabelingReplayBuffer

warnings.warn(
    "algorithms.sb3.wrappers is deprecated: import RelabelingReplayBuffer from algorithms.sb3.buffers",
    DeprecationWarning,
    stacklevel=2,
)
EpisodeRedistributionBuffer = RelabelingReplayBuffer

__all__ = ["EpisodeRedistributionBuffer", "RelabelingReplayBuffer"]
