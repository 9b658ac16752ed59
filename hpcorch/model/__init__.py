"""hpcorch.model."""
