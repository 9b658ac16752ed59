"""The simulated pool and its scheduling round: what both engines and the lower bound
share (:class:`SimConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcorch.sim.regime import Regime


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 16
    gpus_per_node: int = 4
    round_s: float = 60.0
    restart_cost: float = 30.0
    cpus_per_node: int = 48
    """CPUs per node (48: the 4-GPU nodes of the measured cluster had 48 vCPUs)."""
    cpu_demand: tuple[tuple[str, float], ...] = ()
    """(application, seconds of data-loading CPU work per sample); others: 0."""
    cpus_per_gpu: int = 0
    """Fixed CPUs per GPU for every job whatever the policy chooses (0: the policy's)."""
    regime: Regime = field(default_factory=Regime)
    """What the policy knows of a job before it runs (see :mod:`hpcorch.sim.regime`)."""
    gpu_types: tuple[tuple[str, int], ...] = ()
    """A pool of several GPU types: (type, nodes) in node order, the nodes adding up to
    ``nodes`` (:mod:`hpcorch.sim.gputypes`); empty: every GPU of the traces' type."""

    def __post_init__(self) -> None:
        if self.gpu_types and sum(n for _, n in self.gpu_types) != self.nodes:
            raise ValueError(f"GPU types {self.gpu_types} do not add up to {self.nodes} nodes")

    @property
    def node_gpus(self) -> tuple[int, ...]:
        return (self.gpus_per_node,) * self.nodes

    @property
    def node_types(self) -> tuple[str, ...]:
        """GPU type per node (empty: one type)."""
        return tuple(t for t, n in self.gpu_types for _ in range(n))

    @property
    def node_cpus(self) -> tuple[int, ...]:
        return (self.cpus_per_node,) * self.nodes
