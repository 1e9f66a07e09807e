"""torchrun's worker error files, produced by a real torchrun run: the worker's real exception comes first.

torchrun gives every worker TORCHELASTIC_ERROR_FILE under --log-dir; a worker whose entry point is decorated
with ``@record`` writes its exception there as JSON (torch/distributed/elastic/multiprocessing/errors).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from ddpdoctor.explain import ExplainResult, explain_streams, rank_from_path
from ddpdoctor.ports import free_port

WORKER = textwrap.dedent('''
    import os
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main() -> None:
        if os.environ["RANK"] == "1":
            raise ValueError("learning rate schedule has 0 steps")

    main()
''')


@pytest.fixture(scope="module")
def torchrun_failure(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("torchrun")
    (tmp / "train.py").write_text(WORKER)
    console = tmp / "console.log"
    with console.open("wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={free_port()}",
             "--log-dir", str(tmp / "logs"), str(tmp / "train.py")],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp, timeout=180,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    (error_file,) = (tmp / "logs").rglob("error.json")
    return console, error_file


def _explain(*paths: Path) -> ExplainResult:
    with ExitStack() as stack:
        return explain_streams([(str(p), stack.enter_context(p.open("rb")), rank_from_path(str(p))) for p in paths])


def test_error_file_alone_gives_the_workers_exception_and_rank(torchrun_failure: tuple[Path, Path]) -> None:
    _, error_file = torchrun_failure
    assert rank_from_path(str(error_file)) == 1  # {log_dir}/{run}/attempt_0/1/error.json
    result = _explain(error_file)
    assert [d.id for d in result.diagnoses] == ["python-exception"]
    d = result.diagnoses[0]
    assert d.ranks == {1}
    # The fallback names the exception and the worker's own frame (issue 26): raise is on line 8 of train.py.
    train = error_file.parents[4] / "train.py"
    assert d.details == {"exception": ["ValueError"], "message": ["learning rate schedule has 0 steps"],
                         "frame": [f"{train}:8 in main"]}
    assert (d.first_rank, d.first_event.exception if d.first_event else None) == (1, "ValueError")


def test_real_exception_comes_before_torchruns_exit_code(torchrun_failure: tuple[Path, Path]) -> None:
    console, error_file = torchrun_failure
    for inputs in [(console, error_file), (error_file, console), (console,)]:
        ids = [d.id for d in _explain(*inputs).diagnoses]
        assert ids[:2] == ["python-exception", "worker-failed"], (inputs, ids)


def test_a_json_file_that_is_not_an_error_file_is_scanned_as_a_log(tmp_path: Path) -> None:
    log = tmp_path / "metrics.json"
    log.write_text('{"step": 1}\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n')
    assert [d.id for d in _explain(log).diagnoses] == ["cuda-oom"]
