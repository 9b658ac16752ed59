"""Access to Slurm: the batch-script renderer (pure), JSON parsers (pure) and backends."""

from hpcorch.slurm.backend import SlurmBackend, SlurmCLI
from hpcorch.slurm.parse import SlurmJob, SlurmNode, parse_nodes, parse_squeue

__all__ = [
    "SlurmBackend",
    "SlurmCLI",
    "SlurmJob",
    "SlurmNode",
    "parse_nodes",
    "parse_squeue",
]
