"""The sidecar: run, watch, stop and relaunch a training script that does not use
hpcorch's runtime (the non-intrusive mode). The job wrapper runs it in place of srun."""

from hpcorch.sidecar.config import SidecarConfig, SidecarError, config_from_env

__all__ = ["SidecarConfig", "SidecarError", "config_from_env"]
