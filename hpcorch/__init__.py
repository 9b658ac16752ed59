"""hpcorch: elastic batch-size orchestration of deep-learning training on Slurm."""

__version__ = "0.1.0"
