"""Pure scheduling policies: a snapshot of jobs and the pool in, a plan out (numpy only)."""
