"""hpcorch.sim."""
