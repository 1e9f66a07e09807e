"""The message inventory mapped to the knowledge base, and `explain` held to it (issue 26).

tests/data/explain_inventory/ lists every error and warning text torch.distributed (Python, c10d's C++, torchrun),
NCCL, gloo and the launch frameworks can print (scripts/build_explain_inventory.py, from their sources);
rules.json there maps each one to a signature, `not-a-failure` or `generic` (with the reason);
scripts/build_explain_mapping.py turns that into mapping.jsonl, ddpdoctor/explain/templates.json (the matcher's
table) and the figures table of docs/internals/explain-kb.md. Here:

* the generated files are what the rules give today (a rule edited without regenerating fails), every entry is
  mapped, every rule maps something, every id a rule names exists;
* every template mapped to a signature, turned into the lines a real log holds (`inventory.log_lines`: the
  message after `[rank1]:`, in a traceback, a glog header or NCCL's `host:pid:tid [1] file.cc:123 NCCL WARN`),
  is diagnosed as that signature first, citing where the message is printed; >= 90 % of the failure templates
  of torch.distributed + NCCL are named by a signature of their own;
* messages mapped `not-a-failure` give no failure diagnosis;
* the matcher looks a line up by its words and never tries every template.
"""

from __future__ import annotations

import importlib.util
import io
import json
from collections import Counter
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from ddpdoctor.explain import (
    ExplainResult,
    Signature,
    explain_streams,
    explain_text,
    inventory,
    load_kb,
    scanner,
    templates,
)
from ddpdoctor.explain.inventory import GENERIC, NOT_A_FAILURE, TARGET_SOURCES, Mapped

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "tests" / "data" / "explain_inventory"


@cache
def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_explain_mapping", ROOT / "scripts" / "build_explain_mapping.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _mapped() -> tuple[Mapped, ...]:
    return tuple(inventory.build_mapping(inventory.load_entries(INVENTORY),
                                         inventory.load_rules(INVENTORY / inventory.RULES_FILE)))


def _explain(text: str, monkeypatch: pytest.MonkeyPatch) -> ExplainResult:
    """The engine the CLI uses, on one instantiated template. Small read buffers: the default 5 MB buffer is
    allocated per scan, which is nothing for one log and minutes for the thousands of scans here."""
    monkeypatch.setattr(scanner, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(scanner, "MAX_LINE_BYTES", 1 << 16)
    return explain_streams([("train.log", io.BytesIO(text.encode()), None)], _kb())


@cache
def _kb() -> list[Signature]:
    return load_kb()


def test_generated_files_are_fresh_and_every_entry_is_mapped() -> None:
    """mapping.jsonl, templates.json and the figures table are what rules.json gives today; no entry is
    unmapped, no rule is dead, every signature a rule names exists in kb.json."""
    files, problems = _script().outputs()
    assert problems == [], "\n".join(problems)
    stale = [str(p.relative_to(ROOT)) for p, text in files.items() if p.read_text(encoding="utf-8") != text]
    assert stale == [], f"stale: {stale}; run python scripts/build_explain_mapping.py"


def test_every_non_signature_target_says_why() -> None:
    rows = [json.loads(line) for line in (INVENTORY / inventory.MAPPING_FILE).read_text().splitlines()]
    assert len(rows) == len(inventory.load_entries(INVENTORY))
    for row in rows:
        if row["to"] in (GENERIC, NOT_A_FAILURE):
            assert len(row.get("reason", "")) >= 20, row


def test_mapped_templates_are_named_by_their_signature_and_cite_their_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coverage test: every template the mapping gives a signature is recognised as exactly that signature,
    first, from the lines a log holds; the diagnosis' details say where the message is printed."""
    wrong: list[str] = []
    checked: Counter[str] = Counter()
    # The line is credited to the most specific template it matches: the entry's own, or another place that
    # prints a text of the same signature the line also matches (the same message in two files).
    signature_of = {t.where: t.signature for t in templates.load_templates()}
    for m in _mapped():
        if m.template is None:
            continue
        checked[m.entry.source] += 1
        result = _explain(inventory.log_lines(m.entry), monkeypatch)
        got = [d.id for d in result.diagnoses]
        if not got or got[0] != m.to:
            wrong.append(f"{m.entry.where}: mapped {m.to}, explain says {got} for {m.entry.template[:70]!r}")
            continue
        first = result.diagnoses[0]
        sources = first.details.get("template_source", [])
        if not sources or any(signature_of.get(s) != m.to for s in sources):
            wrong.append(f"{m.entry.where}: no provenance in details {first.details}")
    assert not wrong, f"{len(wrong)} of {sum(checked.values())} wrong:\n" + "\n".join(wrong[:40])
    assert sum(checked[s] for s in TARGET_SOURCES) > 2500, checked


def _wrapped(text: str, width: int) -> str:
    """The lines as a terminal `width` columns wide shows them: each longer line cut into pieces, no marker."""
    return "".join("\n".join(line[i:i + width] for i in range(0, len(line), width)) + "\n"
                   for line in text.splitlines() if line) if text else text


def test_mapped_templates_terminal_wrapped_keep_their_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same lines copied from a terminal 80, 100 or 120 columns wide (issue 15's pastes): the scanner rejoins
    the pieces, and a long message is matched on its first 100 characters of text, so all but a few keep their
    signature first (the ones lost are messages whose first 100 characters wrap over more pieces than the
    scanner rejoins)."""
    lost, total = [], 0
    for m in _mapped():
        if m.template is None:
            continue
        text = inventory.log_lines(m.entry)
        for width in (80, 100, 120):
            total += 1
            got = [d.id for d in _explain(_wrapped(text, width), monkeypatch).diagnoses]
            if not got or got[0] != m.to:
                lost.append(f"{width} columns, {m.entry.where}: mapped {m.to}, explain says {got}")
    assert total > 9000
    assert len(lost) <= total // 200, "\n".join(lost[:40])


def test_coverage_of_torch_distributed_and_nccl_is_at_least_90_percent() -> None:
    """Issue 26's target, per the mapping the previous test holds explain to: of the failure templates (literal
    text, not `not-a-failure`) of torch.distributed's Python, C++ and torchrun, and NCCL, >= 90 % are named by a
    signature of their own (not the generic fallback, not unmapped); each source is reported in the docs."""
    figs = inventory.coverage(_mapped())
    total = inventory.Figures()
    for source in TARGET_SOURCES:
        f = figs[source]
        total.specific += f.specific
        total.generic += f.generic
        total.unmapped += f.unmapped
        assert f.unmapped == 0
    assert total.failures > 3000
    assert total.specific >= 0.90 * total.failures, inventory.figures_table(figs)
    assert figs["nccl"].specific >= 0.90 * figs["nccl"].failures


def test_not_a_failure_templates_give_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """INFO, retries, hints, deprecations, teardown chatter: no cause, crash, lagging-rank or symptom from them.
    (NCCL's ncclSuccess / ncclInProgress strings are left out: log_lines can only show an error string inside an
    exception, which is not how NCCL prints them.)"""
    alarms = []
    for m in _mapped():
        if m.to != NOT_A_FAILURE or not m.entry.literal or m.entry.kind == "nccl-errstr":
            continue
        result = _explain(inventory.log_lines(m.entry), monkeypatch)
        serious = [d.id for d in result.diagnoses if d.signature.role != "warning"]
        if serious:
            alarms.append(f"{m.entry.where} ({m.reason[:40]}): {serious} for {m.entry.template[:70]!r}")
    assert not alarms, "\n".join(alarms)


def test_a_line_meets_only_the_templates_filed_under_its_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never thousands of patterns per line: a line is checked against the templates filed under its own words
    (each template under one word); a line of ordinary words checks none, a long line of error words few."""
    matcher = templates.matcher_for(frozenset(s.id for s in _kb()))
    assert len(matcher.templates) > 2500
    calls: list[str] = []
    real = templates.Template.matches

    def counting(self: templates.Template, text: str) -> bool:
        calls.append(self.where)
        return real(self, text)

    monkeypatch.setattr(templates.Template, "matches", counting)
    per_word = Counter(t.token for t in matcher.templates)
    trainer = "[rank3]: epoch 2 step 400/5000 | loss 0.4123 | lr 1.0e-4 | tokens/s 51234 | throughput 3.2"
    assert matcher.match(trainer) is None
    assert len(calls) == sum(per_word[w] for w in set(templates.WORD.findall(trainer))) < 10
    calls.clear()
    # Every word of a torch.distributed error appears in some template; still only their few templates are tried.
    words = " ".join(sorted({w for t in matcher.templates[:400] for p in t.pieces for w in templates.WORD.findall(p)}))
    matcher.match(words[:4096])
    assert len(calls) <= sum(per_word[w] for w in set(templates.WORD.findall(words[:4096])))
    assert len(calls) < len(matcher.templates) / 4


def test_template_pieces_are_found_in_order_in_linear_time() -> None:
    """The check is `str.find` piece after piece: order matters, values in between are free, and a line made of
    repeats of a template's own pieces is decided in one pass (no regex backtracking: see issue 20)."""
    t = templates.Template("x", ("Timed out after ", " seconds waiting for clients. ", " clients joined."), "clients",
                           ("Error: ",), "pytorch test")
    assert t.matches("DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.")
    assert not t.matches("clients joined. Timed out after 901 seconds waiting for clients.")
    hostile = "Timed out after  seconds waiting for clients. " * 100_000
    assert not t.matches(hostile)  # the third piece never comes: one pass over 4.6 MB, then False


def test_whole_words_skip_words_glued_to_a_value() -> None:
    """A value formatted in next to a word changes the word a log line shows ("{}ms" -> "500ms")."""
    assert templates.whole_words("timed out after {}ms waiting") == ["timed", "out", "after", "waiting"]
    assert templates.whole_words("{}Watchdog caught collective operation timeout: {}") == [
        "caught", "collective", "operation", "timeout"]


# --- the families, on the texts real logs hold (sources named; tuning-half logs of tests/data/real_logs) ----

FAMILY_LINES = [
    # NVIDIA/nccl#1405 (nccl_ib_completion_error_12_recv.log): an external IB plugin's older format
    ("kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.216.210.236<54862> "
     "with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid fd00:1148:9000:5000:4:200:3:ff22\n",
     "nccl-ib-error", {"ib_status": ["12"], "vendor_err": ["129"]}),
    # NCCL v2.28.9 src/misc/ibvwrap.cc (template), as NCCL prints a WARN line
    ("node-a:4565:4601 [1] misc/ibvwrap.cc:307 NCCL WARN Call to ibv_modify_qp failed with 22 Invalid argument, "
     "local GID ::ffff:10.0.0.1, remote GID ::ffff:10.0.0.2\n", "nccl-ib-error", {"verbs_call": ["ibv_modify_qp"]}),
    # Project-MONAI/tutorials#1665 (local_rank_arg_monai_launch_futurewarning.log)
    ("brats_training_ddp.py: error: unrecognized arguments: --local-rank=0\n"
     "[2024-03-16 03:30:01,302] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 2) "
     "local_rank: 0 (pid: 380) of binary: /usr/bin/python\n", "local-rank-argument", {}),
    # fdbtrs/IDiff-Face#6 (script_not_found_launch_two_ranks.log)
    ("/usr/bin/python3: can't open file 'train_jonas.py': [Errno 2] No such file or directory\n"
     "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 2) local_rank: 0 (pid: 1218) of binary: "
     "/usr/bin/python3\n", "script-not-found", {"script": ["train_jonas.py"]}),
    # ZettaAI/zetta_utils#671 (slurm_time_limit_cancelled_step.log)
    ("slurmstepd: error: *** STEP 494583.0 ON node-7 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***\n",
     "slurm-job-cancelled", {"reason": ["TIME LIMIT"]}),
    # meta-pytorch/torchx#540 (hostname_gai_errors_ray_command_actor.log); socket.cpp recordError template
    ("(CommandActor pid=369, ip=10.131.6.134) [0]:[W socket.cpp:558] [c10d] The IPv4 network addresses of "
     "(codeflare-ray-head, 50176) cannot be retrieved (gai error: -2 - Name or service not known).\n",
     "hostname-resolution", {"reason": ["Name or service not known"]}),
    # pytorch/pytorch#45326 (ddp_no_grad_module_vgg_feature_extractor.log); torch/nn/parallel/distributed.py
    ("[rank0]: RuntimeError: DistributedDataParallel is not needed when a module doesn't have any parameter that "
     "requires a gradient.\n", "ddp-no-trainable-parameters", {}),
    # TCPStore.cpp (template); cocktailpeanut/fluxgym#302 quotes it on Windows
    ("torch.distributed.DistStoreError: use_libuv was requested but PyTorch was build without libuv support\n",
     "libuv-unavailable", {}),
    # gpustack/gpustack#2125 (gloo_connect_full_mesh_ray_worker_no_error.log); ProcessGroupGloo.cpp template
    ("(RayWorkerWrapper pid=933, ip=50.147.43.24) [rank1]:[E528 08:52:46.164295950 ProcessGroupGloo.cpp:145] Gloo "
     "connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n",
     "gloo-connect-failed", {}),
    # ray-project/ray_lightning#84 (lightning_requested_gpu_none_visible_ray.log), as a torchrun worker prints it
    # (`[rank1]:`): alone, with no rank, launcher or process group in the log, it is not a distributed failure
    ("[rank1]: pytorch_lightning.utilities.exceptions.MisconfigurationException: You requested GPUs: [0]\n"
     "[rank1]:  But your machine only has: []\n", "no-gpu-visible", {}),
    # torch/cuda/__init__.py's runtime error, a rank launched with CUDA_VISIBLE_DEVICES="" (issue 26's H100 logs)
    ("[rank1]: RuntimeError: No CUDA GPUs are available\n", "no-gpu-visible", {}),
    # torch/nn/modules/batchnorm.py (template)
    ("[rank0]: ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone\n",
     "syncbn-misuse", {}),
    # deepspeedai/DeepSpeed#3232 (sigkill_deepspeed_launcher_return_code_minus9.log, its argument list shortened):
    # deepspeed/launcher/launch.py's "{} exits with return code = {}"
    ("[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', 'main.py', "
     "'--local_rank=0', '--zero_stage', '2', '--deepspeed'] exits with return code = -9\n",
     "worker-killed-by-signal", {"signal": ["SIGKILL"]}),
    # torch/distributed/elastic/multiprocessing/api.py (template): torchrun itself got SIGTERM
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 2473 got signal: 15\n",
     "agent-received-signal", {}),
]


@pytest.mark.parametrize(("text", "expected", "details"), FAMILY_LINES, ids=[e for _, e, _ in FAMILY_LINES])
def test_new_families_on_real_texts(text: str, expected: str, details: dict[str, list[str]]) -> None:
    d = explain_text(text).diagnoses[0]
    assert d.id == expected, [x.id for x in explain_text(text).diagnoses]
    for key, values in details.items():
        assert d.details.get(key) == values, d.details


def test_template_only_line_names_its_source_in_the_json(tmp_path: Path) -> None:
    """What a user gets from `explain --json -`: the diagnosis' details cite the message's project, version and
    file:line, so a reader can open the very source that printed it."""
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    log = tmp_path / "rank0.log"
    log.write_text("[rank0]: torch.distributed.DistStoreError: use_libuv was requested but PyTorch was build "
                   "without libuv support\n")
    run = CliRunner().invoke(app, ["explain", "--json", "-", str(log)])
    assert run.exit_code == 1, run.output
    (d,) = json.loads(run.stdout)["diagnoses"]
    assert d["id"] == "libuv-unavailable"
    assert any(s.startswith("pytorch ") and "torch/csrc/distributed/c10d/TCPStore.cpp:" in s
               for s in d["details"]["template_source"]), d["details"]
