"""Parse ``scontrol show assoc_mgr flags=users,assoc,qos`` and ``scontrol -o show
partition``: the limits slurmctld enforces and the usage it counts against them. Pure.

The association manager's text is the same from Slurm 22.05 to 25.11 but for details this
parser takes either way: 25.11 names a QOS's users ``name(uid)`` where 22.05 gives the uid
alone, writes ``Lineage=`` where 22.05 wrote ``Lft=``, and adds ``gres/gpumem`` and
``gres/gpuutil`` TRES and a ``Comment=`` line. A value is written ``LIMIT(USED)``, with
``N`` for no limit (``GrpTRES=cpu=N(2),gres/gpu=8(2)``, ``MaxJobs=4(2)``), or ``LIMIT``
alone for a per-job limit (``MaxTRESPJ=node=2,gres/gpu=4``); times are minutes.
``tests/fixtures/slurm-*/assoc_mgr.txt`` are real outputs (tests/fixtures/record-limits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from hpcorch.timefmt import DurationError, parse_duration

Counted = tuple[int | None, int | None]
"""(limit, used): None where there is no limit, or no count given."""

NONE: Counted = (None, None)

_SPLIT = re.compile(r"\s+(?=[A-Za-z/]+=)")
_VALUE = re.compile(r"^(N|-?\d+(?:\.\d+)?)?(?:\((-?\d+(?:\.\d+)?)\))?$")
_NAME_ID = re.compile(r"^(.*?)\((\d+)\)$")


@dataclass(frozen=True)
class UsageLimits:
    """One association's, QOS's, or a user's or account's within a QOS: counts of running
    and submitted jobs, and TRES (``gres/gpu``, ``cpu``, ``node``, ``mem``: MB)."""

    jobs: Counted = NONE
    submit: Counted = NONE
    tres: Mapping[str, Counted] = field(default_factory=dict)


@dataclass(frozen=True)
class PerJob:
    """Limits of each job alone."""

    tres: Mapping[str, int] = field(default_factory=dict)
    """``MaxTRESPJ``."""
    per_node: Mapping[str, int] = field(default_factory=dict)
    """``MaxTRESPN``."""
    wall_min: int | None = None
    """``MaxWallPJ``, minutes."""


@dataclass(frozen=True)
class Association:
    id: int
    cluster: str
    account: str
    user: str
    """'' for an account's own association."""
    uid: int
    partition: str
    parent: str
    """The parent account of an account's association ('' for root, and for users')."""
    grp: UsageLimits = field(default_factory=UsageLimits)
    """``GrpJobs``, ``GrpSubmitJobs``, ``GrpTRES``: the association and all below it."""
    max_jobs: Counted = NONE
    """``MaxJobs``: running jobs of this association (a user's, per account)."""
    max_submit: Counted = NONE
    per_job: PerJob = field(default_factory=PerJob)


@dataclass(frozen=True)
class Qos:
    name: str
    grp: UsageLimits = field(default_factory=UsageLimits)
    """``GrpJobs``, ``GrpSubmitJobs``, ``GrpTRES``: every job of the QOS."""
    per_job: PerJob = field(default_factory=PerJob)
    users: Mapping[int, UsageLimits] = field(default_factory=dict)
    """uid -> ``MaxJobsPU``, ``MaxSubmitJobsPU``, ``MaxTRESPU`` and the user's usage."""
    accounts: Mapping[str, UsageLimits] = field(default_factory=dict)
    """account -> ``MaxJobsPA``, ``MaxSubmitJobsPA``, ``MaxTRESPA`` and its usage."""


@dataclass(frozen=True)
class AssocMgr:
    users: Mapping[str, int] = field(default_factory=dict)
    """user name -> uid."""
    default_account: Mapping[str, str] = field(default_factory=dict)
    associations: tuple[Association, ...] = ()
    qos: Mapping[str, Qos] = field(default_factory=dict)

    def association(self, account: str, user: str, partition: str = "") -> Association | None:
        """The association a job of ``user`` under ``account`` (in ``partition``) runs
        under: the partition's own, else the user's in the account."""
        found = None
        for a in self.associations:
            if a.account == account and a.user == user:
                if a.partition == partition and partition:
                    return a
                if not a.partition:
                    found = a
        return found

    def account(self, account: str) -> Association | None:
        """An account's own association."""
        return next((a for a in self.associations if a.account == account and not a.user), None)


@dataclass(frozen=True)
class Partition:
    name: str
    max_nodes: int | None = None
    max_time_min: int | None = None
    max_cpus_per_node: int | None = None
    max_mem_per_node_mb: int | None = None
    qos: str = ""
    """The partition's QOS ('' for none)."""


class AssocMgrError(ValueError):
    """Text that is not ``scontrol show assoc_mgr``'s."""


def _num(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def counted(value: str) -> Counted:
    """``4(2)`` -> (4, 2); ``N(2)`` -> (None, 2); ``4`` -> (4, None); '' -> (None, None)."""
    m = _VALUE.match(value.strip())
    if not m:
        return NONE
    limit = None if m.group(1) in (None, "N") else _num(m.group(1))
    used = _num(m.group(2)) if m.group(2) is not None else None
    return limit, used


TRES_USED = frozenset({"gres/gpu", "cpu", "node", "mem"})
"""The TRES hpcorch plans (the others: energy, billing, gres/gpumem, ... are left out)."""


def tres_counted(value: str) -> dict[str, Counted]:
    """``cpu=N(2),gres/gpu=8(2)`` -> {"cpu": (None, 2), "gres/gpu": (8, 2)} (of
    :data:`TRES_USED`)."""
    out: dict[str, Counted] = {}
    for part in value.split(","):
        name, sep, rest = part.partition("=")
        if sep and name.strip() in TRES_USED:
            out[name.strip()] = counted(rest)
    return out


def tres_limits(value: str) -> dict[str, int]:
    """``node=2,gres/gpu=4`` -> {"node": 2, "gres/gpu": 4} (limits only)."""
    return {k: v[0] for k, v in tres_counted(value).items() if v[0] is not None}


def _fields(line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in _SPLIT.split(line.strip()):
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value.strip()
    return out


def _name_id(value: str) -> tuple[str, int]:
    m = _NAME_ID.match(value)
    if m:
        return m.group(1), int(m.group(2))
    return value, -1


def _usage(f: Mapping[str, str], suffix: str = "") -> UsageLimits:
    return UsageLimits(
        jobs=counted(f.get(f"MaxJobs{suffix}" if suffix else "GrpJobs", "")),
        submit=counted(f.get(f"MaxSubmitJobs{suffix}" if suffix else "GrpSubmitJobs", "")),
        tres=tres_counted(f.get(f"MaxTRES{suffix}" if suffix else "GrpTRES", "")),
    )


def _per_job(f: Mapping[str, str]) -> PerJob:
    return PerJob(
        tres=tres_limits(f.get("MaxTRESPJ", "")),
        per_node=tres_limits(f.get("MaxTRESPN", "")),
        wall_min=counted(f.get("MaxWallPJ", ""))[0],
    )


def parse_assoc_mgr(text: str) -> AssocMgr:
    """The users, associations and QOS of ``scontrol show assoc_mgr`` (any flags)."""
    if "Association Manager state" not in text:
        raise AssocMgrError("not the output of scontrol show assoc_mgr")
    users: dict[str, int] = {}
    default_account: dict[str, str] = {}
    assocs: list[Association] = []
    qos: dict[str, Qos] = {}
    section = ""
    cur: dict[str, str] | None = None  # the record being read
    sub: dict[str, dict[str, dict[str, str]]] = {"users": {}, "accounts": {}}
    sub_kind = ""
    sub_name = ""

    def close() -> None:
        nonlocal cur
        if cur is None:
            return
        if section == "assoc":
            assocs.append(_association(cur))
        elif section == "qos":
            q = _qos(cur, sub)
            qos[q.name] = q
        cur = None

    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped in ("User Records", "Association Records", "QOS Records"):
            close()
            section = {"User": "users", "Association": "assoc", "QOS": "qos"}[stripped.split()[0]]
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            close()
            f = _fields(line)
            if section == "users" and "UserName" in f:
                name, uid = _name_id(f["UserName"])
                users[name] = uid
                default_account[name] = f.get("DefAccount", "")
            elif section in ("assoc", "qos") and ("ClusterName" in f or "QOS" in f):
                cur = dict(f)
                sub = {"users": {}, "accounts": {}}
                sub_kind = ""
            continue
        if cur is None:
            continue
        if section == "qos" and stripped in ("Account Limits", "User Limits"):
            sub_kind = "accounts" if stripped.startswith("Account") else "users"
            continue
        if sub_kind and indent <= 6 and "=" not in stripped:
            if not stripped.startswith("No "):  # "No Users", "No Accounts"
                sub_name = stripped
                sub[sub_kind][sub_name] = {}
            continue
        if sub_kind and indent > 6 and sub_name in sub[sub_kind]:
            sub[sub_kind][sub_name].update(_fields(stripped))
            continue
        cur.update(_fields(stripped))
    close()
    return AssocMgr(users, default_account, tuple(assocs), qos)


def _association(f: Mapping[str, str]) -> Association:
    user, uid = _name_id(f.get("UserName", ""))
    parent, _ = _name_id(f.get("ParentAccount", ""))
    return Association(
        id=_num(f.get("ID", "")) or 0,
        cluster=f.get("ClusterName", ""),
        account=f.get("Account", ""),
        user=user,
        uid=uid,
        partition=f.get("Partition", ""),
        parent=parent,
        grp=_usage(f),
        max_jobs=counted(f.get("MaxJobs", "")),
        max_submit=counted(f.get("MaxSubmitJobs", "")),
        per_job=_per_job(f),
    )


def _qos(f: Mapping[str, str], sub: Mapping[str, Mapping[str, Mapping[str, str]]]) -> Qos:
    name, _ = _name_id(f.get("QOS", ""))
    users: dict[int, UsageLimits] = {}
    for key, uf in sub["users"].items():
        who, uid = _name_id(key)  # 22.05: "1001"; 25.11: "hpcorch-alice(1001)"
        if uid < 0 and who.isdigit():
            uid = int(who)
        if uid >= 0:
            users[uid] = _usage(uf, "PU")
    accounts = {a: _usage(af, "PA") for a, af in sub["accounts"].items()}
    return Qos(name=name, grp=_usage(f), per_job=_per_job(f), users=users, accounts=accounts)


def parse_partitions(text: str) -> dict[str, Partition]:
    """``scontrol -o show partition``: each partition's limits on a job."""
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        f = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        name = f.get("PartitionName")
        if not name:
            continue
        q = f.get("QoS", "N/A")
        out[name] = Partition(
            name=name,
            max_nodes=_limit(f.get("MaxNodes", "")),
            max_time_min=_minutes(f.get("MaxTime", "")),
            max_cpus_per_node=_limit(f.get("MaxCPUsPerNode", "")),
            max_mem_per_node_mb=_limit(f.get("MaxMemPerNode", "")),
            qos="" if q in ("N/A", "(null)", "") else q,
        )
    return out


def _limit(value: str) -> int | None:
    if value.upper() in ("", "UNLIMITED", "NONE", "N/A"):
        return None
    return _num(value)


def _minutes(value: str) -> int | None:
    """A Slurm duration (``02:00:00``, ``1-00:00:00``) as whole minutes; None for
    UNLIMITED or what is not a duration."""
    try:
        seconds = parse_duration(value)
    except DurationError:
        return None
    return None if seconds is None else seconds // 60
