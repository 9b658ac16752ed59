"""GPU type names (Slurm's GRES types, ``Gres=gpu:a100:4``): checked, carried in a job's
comment, and read off a job's nodes. Pure.

A job accepts a set of types (``hpcorch submit --gpu-types a100,h100``; none: any). Its
comment carries them as ``types=a100+h100`` (``+``: the comment's fields are split at
commas, and no type name holds a ``+``). A launch on nodes of several types (only where
the site allows it) is named by its types joined with ``+`` in sorted order
(``a100+v100``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

TYPE_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
"""A GRES type name as Slurm takes it: letters, digits, ``_``, ``-`` and ``.``."""
MAX_TYPES = 16
"""Types one job may accept at most."""
TAG_SEP = "+"


class GpuTypeError(ValueError):
    """GPU types that are malformed, too many or repeated (one line for people)."""


def parse_gpu_types(
    value: str | Sequence[str] | None, what: str = "--gpu-types"
) -> tuple[str, ...]:
    """``a100,h100`` (or a list of names) as a tuple of checked names, in the order given;
    () for None. Raises :class:`GpuTypeError` for an empty list, a bad name, a repeated
    one or more than :data:`MAX_TYPES`."""
    if value is None:
        return ()
    if isinstance(value, str):
        names: list[object] = list(value.split(",")) if value else []
    elif isinstance(value, Sequence):
        names = list(value)
    else:
        raise GpuTypeError(f"{what} must be a comma list of GPU types, got {type(value).__name__}")
    if not names:
        raise GpuTypeError(f"{what} is empty: name at least one GPU type, e.g. a100")
    if len(names) > MAX_TYPES:
        raise GpuTypeError(f"{what}: at most {MAX_TYPES} GPU types, got {len(names)}")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or not TYPE_RE.fullmatch(name):
            shown = _shown(name)
            raise GpuTypeError(
                f"{what}: invalid GPU type {shown}: use 1-32 letters, digits and _ . - "
                "(as Slurm names them in Gres=gpu:TYPE:N)"
            )
        if name in out:
            raise GpuTypeError(f"{what}: GPU type {name!r} is given twice")
        out.append(name)
    return tuple(out)


def _shown(name: object) -> str:
    if not isinstance(name, str):
        return type(name).__name__
    text = "".join(c if " " <= c <= "~" else "?" for c in name[:40])
    return repr(text + ("..." if len(name) > 40 else ""))


def tag_value(types: Sequence[str]) -> str:
    """The comment's ``types=`` value of ``types``."""
    return TAG_SEP.join(types)


def parse_tag(raw: str | None) -> tuple[str, ...]:
    """A comment's ``types=`` value, checked as :func:`parse_gpu_types` checks the option
    (:class:`GpuTypeError`); () when absent."""
    if raw is None:
        return ()
    return parse_gpu_types(raw.split(TAG_SEP) if raw else [], "types")


def joined(types: Iterable[str]) -> str:
    """Several types as one name: sorted, ``+``-joined, blanks left out ("" for none)."""
    return TAG_SEP.join(sorted({t for t in types if t}))


def type_of_nodes(names: Iterable[str], node_types: Mapping[str, str]) -> str:
    """The GPU type of a job on nodes ``names`` (:func:`joined`; nodes of no known type
    are left out): what Slurm shows of where it runs."""
    return joined(node_types.get(n, "") for n in names)


def unknown_types(wanted: Sequence[str], have: Iterable[str]) -> list[str]:
    """The types of ``wanted`` that are not in ``have``."""
    known = set(have)
    return [t for t in wanted if t not in known]
