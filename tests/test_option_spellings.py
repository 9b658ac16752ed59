"""Every spelling of an sbatch option through ``--sbatch-arg``: only the full names of the
options hpcorch passes on get through.

sbatch reads its options (``#SBATCH`` lines included) with glibc's getopt_long, which takes
any unique prefix of a long option (``--reserv=POOL`` is ``--reservation=POOL``), single
letter options (``-p gpu``), and a required value from the next argument; every ``#SBATCH``
line of a script is one argv, so ``--licenses`` alone would take hpcorch's next line
(``--hold``, ``--output=...``) as its value. RECORDED holds the long options of the sbatch
binaries of Slurm 22.05.8 (Debian 12), 23.11.9, 24.11.7 and 25.11.2, as getopt_long reports
them (every prefix of every name probed: ambiguous, unrecognized, or the option it names);
:func:`resolve` is getopt_long's choice among them (no two of sbatch's aliases share a
prefix, so two matches are always ambiguous). The last test asks the real binaries, where
they are installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcorch.slurm.options import (
    OWNED,
    PASSED,
    POOL_REFUSED,
    OptionError,
    check_extra,
    make_options,
    owned_refusal,
)
from hpcorch.slurm.sbatch_names import SBATCH_LONG_OPTIONS, SBATCH_SHORT_OPTIONS

RECORDED: dict[str, str] = {
    "22.05": """
        account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters
        comment constraint container context contiguous core-spec cores-per-socket cpu-freq
        cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution error exclude
        exclusive export export-file extra-node-info get-user-env gid gpu-bind gpu-freq gpus
        gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs
        input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind
        mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist
        nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
        ntasks-per-tres open-mode output overcommit oversubscribe parsable partition power
        prefer priority profile propagate qos quiet reboot requeue reservation signal
        sockets-per-node spread-job switches tasks-per-node test-only thread-spec
        threads-per-core time time-min tmp uid usage use-min-nodes verbose version wait
        wait-all-nodes wckey wrap
    """,
    "23.11": """
        account acctg-freq array autocomplete batch bb bbf begin chdir cluster
        cluster-constraint clusters comment constraint container container-id context
        contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
        delay-boot dependency distribution error exclude exclusive export extra
        extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
        gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name
        kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
        mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
        ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres
        open-mode output overcommit oversubscribe parsable partition power prefer priority
        profile propagate qos quiet reboot requeue reservation signal sockets-per-node
        spread-job switches tasks-per-node test-only thread-spec threads-per-core time
        time-min tmp tres-bind tres-per-task uid usage use-min-nodes verbose version wait
        wait-all-nodes wckey wrap
    """,
    "24.11": """
        account acctg-freq array autocomplete batch bb bbf begin chdir cluster
        cluster-constraint clusters comment constraint container container-id context
        contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
        delay-boot dependency distribution error exclude exclusive export export-file extra
        extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
        gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name
        kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
        mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
        ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres
        oom-kill-step open-mode output overcommit oversubscribe parsable partition prefer
        priority profile propagate qos quiet reboot requeue reservation resv-ports segment
        signal sockets-per-node spread-job stepmgr switches tasks-per-node test-only
        thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid usage
        use-min-nodes verbose version wait wait-all-nodes wckey wrap
    """,
    "25.11": """
        account acctg-freq array autocomplete batch bb bbf begin chdir cluster
        cluster-constraint clusters comment consolidate-segments constraint container
        container-id context contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
        cpus-per-task deadline delay-boot dependency distribution error exclude exclusive
        export export-file external extra extra-node-info get-user-env gid gpu-bind gpu-freq
        gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold
        ignore-pbs input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label
        mem mem-bind mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile
        nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
        ntasks-per-tres oom-kill-step open-mode output overcommit oversubscribe parsable
        partition prefer priority profile propagate qos quiet reboot requeue reservation
        resources resv-ports segment signal sockets-per-node spread-job spread-segments
        stepmgr switches tasks-per-node test-only thread-spec threads-per-core time time-min
        tmp tres-bind tres-per-task uid usage use-min-nodes verbose version wait
        wait-all-nodes wckey wrap
    """,
}
"""sbatch's long options by Slurm release, recorded from its binaries."""

TABLES = {release: frozenset(text.split()) for release, text in RECORDED.items()}
ALL_NAMES = frozenset().union(*TABLES.values())

_SHORT_TEXT = (
    "A=account a=array b=begin D=chdir M=clusters C=constraint S=core-spec c=cpus-per-task "
    "d=dependency m=distribution e=error x=exclude B=extra-node-info G=gpus h=help H=hold "
    "i=input J=job-name L=licenses k=no-kill F=nodefile w=nodelist N=nodes n=ntasks "
    "o=output O=overcommit s=oversubscribe p=partition q=qos Q=quiet t=time v=verbose "
    "V=version W=wait"
)
SHORT = dict(pair.split("=") for pair in _SHORT_TEXT.split())
"""sbatch's one-letter options (the same in every release recorded)."""

REFUSED = sorted(set(OWNED) | set(POOL_REFUSED))


def resolve(names: frozenset[str], prefix: str) -> str | tuple[str, ...] | None:
    """The option getopt_long reads ``--PREFIX`` as: a name, the ambiguous matches, or None."""
    if prefix in names:
        return prefix
    matches = tuple(sorted(n for n in names if n.startswith(prefix)))
    return matches[0] if len(matches) == 1 else (matches or None)


def refusal(args: tuple[str, ...], pooled: bool = True) -> str:
    with pytest.raises(OptionError) as err:
        check_extra(args, pooled)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("--sbatch-arg"), msg
    return msg


# Spellings that got through before, each what sbatch reads it as.
REPORTED = [
    ("--reserv=POOL", "reservation"),
    ("--nodel=n1", "nodelist"),
    ("--arr=1-100", "array"),
    ("--export-f=/tmp/env", "export-file"),
    ("--exp=ALL,HPCORCH_SPOOL=/tmp/x", "export"),  # 23.11: --export-file is not sbatch's
    ("--depend=afterok:1", "dependency"),
    ("--gpus-per-n=8", "gpus-per-node"),
    ("--cpus-per-t=32", "cpus-per-task"),
    ("--ntasks-per-n=8", "ntasks-per-node"),
    ("--no-req", "no-requeue"),
    ("--requ", "requeue"),
    ("--sign=KILL@1", "signal"),
    ("--open-m=truncate", "open-mode"),
    ("--comme=hpcorch:id=other", "comment"),
    ("--hol", "hold"),
    ("--parsa", "parsable"),
    ("--mem-per-g=10G", "mem-per-gpu"),
]


@pytest.mark.parametrize(("arg", "option"), REPORTED)
def test_the_reported_spellings_are_refused(arg: str, option: str) -> None:
    name = arg[2:].partition("=")[0]
    msg = refusal((arg,))
    assert f"sbatch reads --{name} as --{option}" in msg
    if option in OWNED:
        assert owned_refusal(option) in msg
    else:
        assert f"spell it out: --{option}" in msg


@pytest.mark.parametrize("letter", sorted(SHORT))
def test_short_options_are_refused(letter: str) -> None:
    option = SHORT[letter]
    for args in ((f"-{letter}",), (f"-{letter}", "x"), (f"-{letter}x",), (f"-v{letter}",)):
        msg = refusal(args)
        assert "long form" in msg
    assert f"-{letter} is --{option}" in refusal((f"-{letter}x",))
    assert SBATCH_SHORT_OPTIONS == SHORT


def test_every_prefix_of_a_refused_option_is_refused_naming_it() -> None:
    """Every spelling that getopt_long of some release reads as an option hpcorch owns or
    refuses in a pool, with and without a value, in a pool and (owned ones) outside."""
    checked = 0
    for release, names in TABLES.items():
        for option in REFUSED:
            if option not in names:
                continue
            for n in range(1, len(option)):
                prefix = option[:n]
                if resolve(names, prefix) != option:
                    continue
                for arg in (f"--{prefix}", f"--{prefix}=x"):
                    for pooled in (True, False) if option in OWNED else (True,):
                        msg = refusal((arg,), pooled)
                        assert f"sbatch reads --{prefix} as --{option}" in msg, (release, msg)
                        if option in OWNED:
                            assert owned_refusal(option) in msg
                        else:
                            assert f"not for a job in a pool ({POOL_REFUSED[option]})" in msg
                        checked += 1
    assert checked > 1500


def test_every_prefix_sbatch_cannot_resolve_is_refused() -> None:
    """Ambiguous and unknown prefixes: refused, each naming the candidates."""
    prefixes = {name[:n] for name in ALL_NAMES for n in range(1, len(name))}
    for prefix in sorted(prefixes - ALL_NAMES):
        readings = {resolve(names, prefix) for names in TABLES.values()}
        if any(isinstance(r, str) for r in readings):
            continue
        msg = refusal((f"--{prefix}=1",))
        assert f"--{prefix} is ambiguous to sbatch" in msg
        for r in readings:
            for candidate in r or ():
                assert f"--{candidate}" in msg
    assert "not an sbatch option" in refusal(("--reservations=x",))
    assert "not an sbatch option" in refusal(("--x11",))


@pytest.mark.parametrize("option", sorted(PASSED))
def test_an_abbreviation_of_a_passed_option_says_spell_it_out(option: str) -> None:
    for release, names in TABLES.items():
        assert resolve(names, option) == option, f"--{option} is not exact in {release}"
        for n in range(1, len(option)):
            if resolve(names, option[:n]) == option:
                msg = refusal((f"--{option[:n]}=1",), pooled=False)
                assert f"spell it out: --{option}" in msg


def test_an_sbatch_option_hpcorch_does_not_pass_is_named() -> None:
    for option in ("chdir", "clusters", "hint", "gres-flags", "uid", "help", "quiet"):
        msg = refusal((f"--{option}=x",))
        assert f"hpcorch does not pass --{option} on" in msg
        assert "--mem-per-gpu" in msg  # the valid ones are listed
    # an option only some releases have
    assert "hpcorch does not pass --external on" in refusal(("--external",))
    assert "sbatch reads --tasks-per as --tasks-per-node" in refusal(("--tasks-per=1",))


def test_a_value_needs_its_equals_sign() -> None:
    """``--licenses`` alone would take the next ``#SBATCH`` line (``--hold``) as its value."""
    for option in sorted(PASSED):
        if PASSED[option] == "required":
            msg = refusal((f"--{option}",), pooled=False)
            assert f"--{option} needs a value: --{option}=VALUE" in msg
            assert "needs a value" in refusal((f"--{option}=",), pooled=False)
    assert "needs a value" in refusal(("--licenses", "--reservation=POOL"))
    assert "takes no value" in refusal(("--oversubscribe=yes",), pooled=False)
    assert make_options(extra=("--nice", "--propagate", "--oversubscribe")).extra == (
        "--nice",
        "--propagate",
        "--oversubscribe",
    )


@pytest.mark.parametrize(
    "arg",
    [
        "--RESERVATION=POOL",
        "--Reservation=POOL",
        "--reservatioN=POOL",
        "---reservation=POOL",
        "--reservation =POOL",
        "-- reservation=POOL",
        "--reſervation=POOL",  # LATIN SMALL LETTER LONG S
        "--reservation\n=POOL",
        "\u2014reservation=POOL",  # an em dash
        "--reserv\t=POOL",
        " --reservation=POOL",
        "--reserv_ation=POOL",
        "--=POOL",
        "--",
        "-",
        "",
        "POOL",
    ],
)
def test_odd_spellings_are_refused(arg: str) -> None:
    refusal((arg,))


def test_the_passed_options_still_pass() -> None:
    extra = tuple(f"--{o}" if kind == "none" else f"--{o}=1" for o, kind in sorted(PASSED.items()))
    assert check_extra(extra, pooled=False) == extra
    assert set(PASSED) <= set(SBATCH_LONG_OPTIONS) and not set(PASSED) & set(OWNED)


def test_the_module_knows_every_recorded_option() -> None:
    assert set(SBATCH_LONG_OPTIONS) == ALL_NAMES
    for release, names in TABLES.items():
        assert {n for n, rel in SBATCH_LONG_OPTIONS.items() if release in rel} == names


def _sbatch(release: str) -> Path | None:
    if release == "22.05":
        found = shutil.which("sbatch")
        return Path(found) if found else None
    build = Path(__file__).parent.parent / "slurm" / "build"
    p = subprocess.run([str(build), "--prefix", release], capture_output=True, text=True)
    return Path(p.stdout.strip()) / "bin" / "sbatch" if p.returncode == 0 else None


@pytest.mark.parametrize("release", sorted(RECORDED))
def test_the_real_sbatch_reads_them_as_recorded(release: str, tmp_path: Path) -> None:
    """getopt_long's own words, for each one-letter prefix and each reported spelling
    (no daemon: sbatch stops at the option)."""
    sbatch = _sbatch(release)
    if sbatch is None or not sbatch.exists():
        pytest.skip(f"no sbatch of Slurm {release} here")
    version = subprocess.run([str(sbatch), "--version"], capture_output=True, text=True)
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=probe\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}

    def ask(arg: str) -> str:
        p = subprocess.run(
            [str(sbatch), arg], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL
        )
        return (p.stderr.splitlines() or [""])[0]

    if "option" not in ask("--hold=x"):
        pytest.skip(f"sbatch of Slurm {release} does not start here: {version.stderr}")
    names = TABLES[release]
    for letter in "abcdefghijklmnopqrstuvwxyz":
        said = ask(f"--{letter}=x")
        expect = resolve(names, letter)
        if expect is None:
            assert "unrecognized option" in said, said
        elif isinstance(expect, tuple):
            listed = re.findall(r"'--([^']+)'", said.partition("possibilities:")[2])
            assert sorted(listed) == list(expect), said
        else:
            assert "ambiguous" not in said and "unrecognized" not in said, said
    for arg, option in REPORTED:
        name = arg[2:].partition("=")[0]
        expect = resolve(names, name)
        said = (
            ask(f"--{name}=x")
            if option in ("hold", "parsable", "requeue", "no-requeue")
            else ask(f"--{name}")
        )
        if expect == option:  # getopt_long names it, unless the value is optional
            assert "ambiguous" not in said and "unrecognized" not in said, said
            assert "option '" not in said or f"'--{option}'" in said, said
        else:  # --exp outside 23.11, --export-f in 23.11
            assert "ambiguous" in said or "unrecognized" in said, said


def test_the_help_lists_exactly_what_is_passed() -> None:
    from click.testing import CliRunner

    from hpcorch.cli import main
    from hpcorch.slurm.options import PASSED

    text = " ".join(CliRunner().invoke(main, ["submit", "--help"]).output.split())
    listed = text.split("Passed:")[1].split(";")[0].replace("- ", "-")  # click wraps at hyphens
    assert sorted(n.strip() for n in listed.split(",")) == sorted(PASSED)
