"""How long a backend's requests to Slurm took."""

from __future__ import annotations


class CallClock:
    """How long a backend's requests to Slurm took: in all, and the longest one since
    :meth:`longest_call` was last asked."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._longest = 0.0

    def took(self, seconds: float) -> None:
        self.seconds += seconds
        self._longest = max(self._longest, seconds)

    def longest_call(self) -> float:
        longest, self._longest = self._longest, 0.0
        return longest
