"""How long a backend's requests to Slurm took."""

from __future__ import annotations

import threading


class CallClock:
    """How long a backend's requests to Slurm took: in all (summed over requests, also
    those sent at once), and the longest one since :meth:`longest_call` was last asked.
    Requests may be timed from several threads (the controller's actions)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._longest = 0.0
        self._lock = threading.Lock()

    def took(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
            self._longest = max(self._longest, seconds)

    def longest_call(self) -> float:
        with self._lock:
            longest, self._longest = self._longest, 0.0
        return longest
