"""`ddpdoctor.fr.write_dump`, the hook `watch` uses inside each rank: a real gloo rank writes both formats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddpdoctor.fr import diagnose
from tests.support import REPO, clean_env, free_port

RANK = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
dist.all_reduce(torch.ones(8))
dist.barrier()
from ddpdoctor.fr import write_dump
write_dump(sys.argv[1], 0)
write_dump(sys.argv[1], 0, "json")
dist.destroy_process_group()
"""


def test_a_rank_writes_its_dump_in_both_formats_and_fr_reads_them(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", RANK, str(tmp_path), str(free_port())], capture_output=True,
                         text=True, timeout=120, env=clean_env({"TORCH_FR_BUFFER_SIZE": "2000"}), cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_0.json"]
    for name in ("nccl_trace_rank_0", "nccl_trace_rank_0.json"):
        report = diagnose([str(tmp_path / name)])
        assert report.status == "pass" and report.dumps[0].entries == 2
        assert "(last: #2 barrier" in report.groups[0].note
