"""sbatch's own options, per Slurm release: the names getopt_long resolves an abbreviation
among. Data only; hpcorch/slurm/options.py decides what a user may pass."""

from __future__ import annotations

SBATCH_RELEASES = ("22.05", "23.11", "24.11", "25.11")

_SBATCH_NAMES = """
    account acctg-freq array autocomplete batch bb bbf begin chdir cluster
    cluster-constraint clusters comment consolidate-segments constraint container
    container-id context contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution error exclude exclusive export
    export-file external extra extra-node-info get-user-env gid gpu-bind gpu-freq gpus
    gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs
    input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind
    mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes
    ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres
    oom-kill-step open-mode output overcommit oversubscribe parsable partition power prefer
    priority profile propagate qos quiet reboot requeue reservation resources resv-ports
    segment signal sockets-per-node spread-job spread-segments stepmgr switches
    tasks-per-node test-only thread-spec threads-per-core time time-min tmp tres-bind
    tres-per-task uid usage use-min-nodes verbose version wait wait-all-nodes wckey wrap
"""
_SBATCH_ONLY_IN: dict[str, tuple[str, ...]] = {
    "autocomplete": ("23.11", "24.11", "25.11"),
    "consolidate-segments": ("25.11",),
    "container-id": ("23.11", "24.11", "25.11"),
    "export-file": ("22.05", "24.11", "25.11"),
    "external": ("25.11",),
    "extra": ("23.11", "24.11", "25.11"),
    "oom-kill-step": ("24.11", "25.11"),
    "power": ("22.05", "23.11"),
    "resources": ("25.11",),
    "resv-ports": ("24.11", "25.11"),
    "segment": ("24.11", "25.11"),
    "spread-segments": ("25.11",),
    "stepmgr": ("24.11", "25.11"),
    "tres-bind": ("23.11", "24.11", "25.11"),
    "tres-per-task": ("23.11", "24.11", "25.11"),
}
SBATCH_LONG_OPTIONS: dict[str, tuple[str, ...]] = {
    name: _SBATCH_ONLY_IN.get(name, SBATCH_RELEASES) for name in _SBATCH_NAMES.split()
}
"""Every long option of sbatch, and the releases that have it, as getopt_long of the
sbatch binaries of Slurm 22.05.8, 23.11.9, 24.11.7 and 25.11.2 reads them (every prefix
of every name was asked: tests/test_option_spellings.py). Two options of one release that
start alike are ambiguous to getopt_long: sbatch's only aliases (--ntasks-per-node,
--tasks-per-node) share no prefix."""

SBATCH_SHORT_OPTIONS: dict[str, str] = {
    "A": "account",
    "a": "array",
    "b": "begin",
    "B": "extra-node-info",
    "c": "cpus-per-task",
    "C": "constraint",
    "d": "dependency",
    "D": "chdir",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "h": "help",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "m": "distribution",
    "M": "clusters",
    "n": "ntasks",
    "N": "nodes",
    "o": "output",
    "O": "overcommit",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "s": "oversubscribe",
    "S": "core-spec",
    "t": "time",
    "v": "verbose",
    "V": "version",
    "w": "nodelist",
    "W": "wait",
    "x": "exclude",
}
"""sbatch's one-letter options (the same in 22.05 to 25.11) and the long option of each."""
