"""Access to Slurm: the batch-script renderer (pure), JSON parsers (pure) and backends
(``SlurmCLI`` by default, ``PySlurmBackend`` for Slurm 25.11; ``make_backend`` chooses)."""

from hpcorch.slurm.backend import SlurmBackend, SlurmCLI
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.parse import SlurmJob, SlurmNode, parse_nodes, parse_squeue

__all__ = [
    "SlurmBackend",
    "SlurmCLI",
    "SlurmJob",
    "SlurmNode",
    "make_backend",
    "parse_nodes",
    "parse_squeue",
]
