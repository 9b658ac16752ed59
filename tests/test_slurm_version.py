"""Which Slurm the controller talks to: the version parsed from what each release prints,
the releases refused, and the behaviour chosen per release."""

from __future__ import annotations

import pytest

from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.version import (
    SUPPORTED,
    SlurmUnsupported,
    SlurmVersion,
    behaviour,
    check_supported,
    parse_version,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("slurm-wlm 22.05.8\n", SlurmVersion(22, 5, 8)),  # Debian's scontrol --version
        ("slurm 25.11.2\n", SlurmVersion(25, 11, 2)),
        # scontrol show config: the version line, not the first number-like field
        (
            "Configuration data as of 2026-11-26T10:00:00\nAccountingStorageBackupHost = (null)\n"
            "BatchStartTimeout       = 10 sec\nSLURM_VERSION           = 24.11.7\n",
            SlurmVersion(24, 11, 7),
        ),
        ("SLURM_VERSION = 23.11\n", SlurmVersion(23, 11, 0)),
    ],
)
def test_parses_every_release_s_spelling(text: str, want: SlurmVersion) -> None:
    assert parse_version(text) == want


def test_no_version_is_an_error() -> None:
    with pytest.raises(ValueError, match="no Slurm version"):
        parse_version("slurm_load_ctl_conf error: Unable to contact slurm controller")


@pytest.mark.parametrize("text", ["21.08.8", "26.05.0", "20.11.9"])
def test_unsupported_release_is_one_line_naming_the_supported(text: str) -> None:
    with pytest.raises(SlurmUnsupported) as err:
        check_supported(parse_version(text))
    msg = str(err.value)
    assert "\n" not in msg and text in msg and "supported: 22.05" in msg and "25.11" in msg


@pytest.mark.parametrize("series", SUPPORTED)
def test_every_supported_series_passes(series: str) -> None:
    assert check_supported(parse_version(series + ".1")).series == series


def test_behaviour_by_release() -> None:
    old, new, cur = (behaviour(parse_version(v)) for v in ("22.05.8", "23.11.9", "25.11.2"))
    assert not old.squeue_lists_ended_only_when_asked and not old.nodes_from_scontrol
    assert not new.squeue_lists_ended_only_when_asked and new.nodes_from_scontrol
    assert cur.squeue_lists_ended_only_when_asked
    assert (old.tres_prefix, cur.tres_prefix) == ("gres:gpu", "gres/gpu")
    assert not old.cpus_per_gpu_sticks and not new.cpus_per_gpu_sticks and cur.cpus_per_gpu_sticks
    assert not old.retypes_gpus and new.retypes_gpus and cur.retypes_gpus


class ConfigCLI(SlurmCLI):
    def __init__(self, answer: str) -> None:
        super().__init__()
        self.answer = answer
        self.argv: list[list[str]] = []

    def run(self, argv, stdin=None, env=None):  # type: ignore[no-untyped-def]
        self.argv.append(list(argv))
        return self.answer


def test_cli_asks_slurmctld_and_uses_its_behaviour() -> None:
    cli = ConfigCLI("SLURM_VERSION           = 25.11.2\n")
    version = cli.version()
    assert cli.argv == [["scontrol", "show", "config"]] and str(version) == "25.11.2"
    cli.use(behaviour(version))
    cli.answer = '{"nodes": []}'
    cli.nodes()
    assert cli.argv[-1] == ["scontrol", "show", "nodes", "--json"]  # no sinfo first
    cli.use(behaviour(parse_version("22.05.8")))
    cli.nodes()
    assert cli.argv[-1] == ["sinfo", "--json"]


def test_a_launch_names_its_gpu_type_where_the_release_can_change_it() -> None:
    # 22.05 never runs a requeued job whose GPU request changed type: a launch there asks
    # for GPUs of no type on exactly the planned nodes (whose type they are)
    cli = ConfigCLI("")
    for release, gres in (("25.11.2", "gres:gpu:t4:2"), ("22.05.8", "gres:gpu:2")):
        cli.use(behaviour(parse_version(release)))
        cli.set_shape(7, 1, 2, ["n1"], cpus_per_gpu=4, gpu_type="t4")
        assert f"TresPerNode={gres}" in cli.argv[-1] and "ReqNodeList=n1" in cli.argv[-1]
    cli.set_shape(7, 1, 2, (), gpu_type="t4")  # no nodes named: only the type can say it
    assert "TresPerNode=gres:gpu:t4:2" in cli.argv[-1]
