"""hpcorch.runtime."""
