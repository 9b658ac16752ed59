"""The length a user declares at submission (``--epochs``, ``--dataset-size``): checked by
submit as the controller checks it, written into the job's comment, read back by the
controller's tag parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import jobs, main
from hpcorch.controller.validate import TagError, parse_tags
from hpcorch.protocol import MAX_DECLARED_EPOCHS, MAX_DECLARED_SAMPLES
from hpcorch.request import RequestError, build_request
from hpcorch.slurm.parse import SlurmNode
from hpcorch.slurm.script import parse_comment
from hpcorch.submit import PoolShape, build_spec

SCRIPT = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
SHAPE = PoolShape(partition="gpu", nodes=2, gpus_per_node=4, cpus_per_node=32)


def comment_of(pool: str | None = "hpcorch", **kw: object) -> str:
    req = build_request(SCRIPT, min_gpus=1, max_gpus=4, batch_size=64, pool=pool, **kw)  # type: ignore[arg-type]
    return build_spec(req, SHAPE, "train-1", Path("/jobs/train-1")).comment()


def test_nothing_declared_writes_no_tags() -> None:
    fields = parse_comment(comment_of())
    assert fields is not None
    assert "epochs" not in fields and "dataset" not in fields
    assert (parse_tags(fields).epochs, parse_tags(fields).dataset) == (None, None)


@pytest.mark.parametrize("pool", ["hpcorch", None])
@pytest.mark.parametrize(
    ("epochs", "samples"),
    [
        (90, 1_281_167),
        (1, 1),
        (MAX_DECLARED_EPOCHS, MAX_DECLARED_SAMPLES),
        (20, None),
        (None, 50_000),
    ],
)
def test_what_submit_writes_the_controller_reads(
    pool: str | None, epochs: int | None, samples: int | None
) -> None:
    text = comment_of(pool, epochs=epochs, dataset_size=samples)
    fields = parse_comment(text)
    assert fields is not None
    assert fields.get("epochs") == (None if epochs is None else str(epochs))
    assert fields.get("dataset") == (None if samples is None else str(samples))
    tags = parse_tags(fields)
    assert (tags.epochs, tags.dataset) == (epochs, samples)


def test_declaring_a_length_changes_no_other_tag() -> None:
    plain = comment_of(max_relaunches=2)
    declared = comment_of(max_relaunches=2, epochs=90, dataset_size=1_281_167)
    assert declared.replace(",epochs=90,dataset=1281167", "") == plain


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"epochs": 0}, "--epochs 0 is out of range (1 to 1000000)"),
        ({"epochs": MAX_DECLARED_EPOCHS + 1}, "--epochs 1000001 is out of range"),
        ({"epochs": "90"}, "--epochs must be a whole number, got '90'"),
        ({"epochs": 2.5}, "--epochs must be a whole number"),
        ({"epochs": True}, "--epochs must be a whole number"),
        ({"dataset_size": -1}, "--dataset-size -1 is out of range (1 to 1000000000000)"),
        ({"dataset_size": MAX_DECLARED_SAMPLES + 1}, "--dataset-size 1000000000001 is out"),
    ],
)
def test_the_python_api_refuses_a_bad_length_in_one_line(
    kw: dict[str, object], needle: str
) -> None:
    with pytest.raises(RequestError) as info:
        comment_of(**kw)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_submit_bounds_are_the_controllers() -> None:
    """Anything submit lets through, the controller takes (and one past it, refuses)."""
    parse_tags({"epochs": str(MAX_DECLARED_EPOCHS), "dataset": str(MAX_DECLARED_SAMPLES)})
    for key, hi in (("epochs", MAX_DECLARED_EPOCHS), ("dataset", MAX_DECLARED_SAMPLES)):
        with pytest.raises(TagError):
            parse_tags({key: str(hi + 1)})


class _Backend:
    """Enough of Slurm for a dry run: one partition of two 4-GPU nodes, one pool."""

    def partitions(self) -> tuple[list[str], str]:
        return ["gpu"], "gpu"

    def reservations(self) -> dict[str, list[str]]:
        return {"hpcorch": ["n1", "n2"]}

    def nodes(self) -> list[SlurmNode]:
        return [SlurmNode(n, n, ("IDLE",), ("gpu",), 32, 4, 0, "") for n in ("n1", "n2")]


def test_the_cli_writes_the_declared_length_into_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(jobs, "make_backend", _Backend)
    args = ["submit", "--min-gpus", "1", "--pool", "hpcorch", "--dry-run"]
    args += ["--epochs", "90", "--dataset-size", "1281167", SCRIPT, "--epochs", "3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("#SBATCH --comment=")]
    tags = parse_tags(parse_comment(line.removeprefix("#SBATCH --comment=")) or {})
    assert (tags.epochs, tags.dataset) == (90, 1_281_167)
    assert f"{SCRIPT} --epochs 3\n" in result.stdout  # the script keeps its own --epochs
