"""The controller: a reconcile loop over the cluster seam with durable state (loop.py),
its pure state machine (reconcile.py), the store (store.py) and what it reports (prom.py,
usage.py)."""
