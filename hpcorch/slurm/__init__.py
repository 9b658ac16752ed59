"""hpcorch.slurm."""
