"""What the log's own numbers and addresses say, as details of the diagnosis they sharpen (issue 33, item 5).

A diagnosis names the failure; the values in its lines often name the cause too, if read:

* **a loopback connect address**: gloo's ``connect [127.0.1.1]:PORT: Connection refused``, c10d's ``... trying
  to connect to (127.0.1.1, 29500)``. Debian and Ubuntu map the machine's hostname to 127.0.1.1 in
  /etc/hosts; gloo and c10d advertise the address the hostname resolves to, so a peer on another host is told
  to connect to itself (gloo's transport/tcp device picks the hostname's address unless GLOO_SOCKET_IFNAME
  names an interface);
* **the timeout of a store-based barrier or of a collective**: ``timeout=0:00:30`` in torch's "Timed out
  initializing process group in store based barrier" message (distributed_c10d.py: the timeout passed to
  init_process_group; default_pg_timeout is 30 minutes), ``Timeout(ms)=60000`` in the NCCL watchdog's (the
  NCCL default is 10 minutes, default_pg_nccl_timeout): a value below the default was set by the job, and a
  rank that is merely slow (loading or tokenising data, compiling) is then reported as missing;
* **the interface NCCL picked**: ``NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>`` or ``NET/Socket : Using
  [0]veth...`` (a fact signature, ``hint_for`` in kb.json) under a connect failure or a timeout;
* **Ray Train workers** (``(RayTrainWorker pid=N, ...)`` on the lines) that share a GPU or see none;
* **DeepSpeed's batch arithmetic**: ``16 != 4 * 8 * 4`` in its batch assertion gives the train_batch_size this
  launch needs (the product) and the process count the config was written for;
* **the rank the others waited for** before a collective timeout: a rank with lines in the log that did not
  report the timeout, and its last line of progress ("Tokenizing train split: 45%", "Evaluating: ..."), read
  from the end of the input (the scanner keeps its last MiB anyway).

Each hint quotes the line it came from. Pure functions of the diagnoses and of the inputs' last bytes (no
further pass over the input).
"""

from __future__ import annotations

import re

from ddpdoctor.explain.lines import LINE_PREFIX_RANK, rank_int, strip_paste
from ddpdoctor.explain.model import MAX_EVIDENCE_CHARS, Diagnosis
from ddpdoctor.explain.phases import MAX_TAIL_LINE_CHARS, chatter, tail_lines

# Diagnoses whose details name the address a rank tried to reach.
ADDRESS_DETAILS = {"gloo-connect-failed": ("peer",), "remote-process-exited": ("peer",),
                   "master-connect-timeout": ("host",), "connect-no-route": ("host", "address", "peer"),
                   "nccl-connect-failed": ("address", "peer", "host"), "hostname-resolution": ("address",)}
_LOOPBACK = re.compile(r"^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$")
# torch.distributed's defaults (distributed_c10d.py / constants.py): default_pg_timeout 30 min, and for NCCL
# default_pg_nccl_timeout 10 min (torch >= 2.2).
DEFAULT_PG_TIMEOUT_S = 1800
DEFAULT_NCCL_TIMEOUT_S = 600
# str(datetime.timedelta): "0:00:30", "0:00:30.500000", "1 day, 0:00:00".
_TIMEDELTA = re.compile(r"^(?:(?P<days>\d{1,6}) days?, )?(?P<h>\d{1,2}):(?P<m>\d\d):(?P<s>\d\d)(?:\.\d{1,6})?$")


def timedelta_seconds(text: str) -> float | None:
    """Seconds of a ``str(timedelta)`` value, or None."""
    m = _TIMEDELTA.match(text.strip())
    if m is None:
        return None
    return (int(m.group("days") or 0) * 86400 + int(m.group("h")) * 3600 + int(m.group("m")) * 60
            + int(m.group("s")))


def _line_with(d: Diagnosis, value: str) -> str | None:
    return next((e.text for e in d.evidence if value in e.text), None)


def _loopback(d: Diagnosis) -> list[str]:
    out = []
    for name in ADDRESS_DETAILS.get(d.id, ()):
        for value in d.details.get(name, ()):
            line = _line_with(d, value)
            if _LOOPBACK.match(value) and line is not None:
                out.append(
                    f"The address {value} in \"{line}\" is a loopback address: this host's name resolves to it "
                    "(Debian and Ubuntu map the hostname to 127.0.1.1 in /etc/hosts), so a rank on another host "
                    "is told to connect to itself. If the job spans hosts, set GLOO_SOCKET_IFNAME (gloo) or "
                    "NCCL_SOCKET_IFNAME (NCCL) to the interface of the network between them, or make the "
                    "hostname resolve to that interface's address in /etc/hosts; check with `ddpdoctor env`.")
    return out


def _short_timeout(d: Diagnosis) -> list[str]:
    if d.id == "rendezvous-incomplete":
        values, default, what = d.details.get("timeout", ()), DEFAULT_PG_TIMEOUT_S, "the 30-minute default"
        seconds = [timedelta_seconds(v) for v in values]
    elif d.id == "nccl-timeout":
        values, default, what = d.details.get("timeout_ms", ()), DEFAULT_NCCL_TIMEOUT_S, "NCCL's 10-minute default"
        seconds = [int(v) / 1000 for v in values if v.isdigit()]
    else:
        return []
    out = []
    for value, secs in zip(values, seconds, strict=False):
        line = _line_with(d, value)
        if secs is None or secs >= default or line is None:
            continue
        out.append(f"The timeout in \"{line}\" is {value} ({secs:g} s), shorter than {what}: the job set it "
                   "(init_process_group's timeout=, or a launcher or framework option). A rank that is only slow "
                   "to get there (loading or tokenising data, compiling, an evaluation on one rank) is then "
                   "reported as missing; raise the timeout or make that work happen on every rank or before it.")
    return out


# Ray Train prints each worker's lines behind "(RayTrainWorker pid=N, ip=A)"; its ScalingConfig decides the GPUs
# each worker gets (use_gpu, resources_per_worker) and Ray sets CUDA_VISIBLE_DEVICES from that.
_RAY_WORKER = re.compile(r"\(RayTrainWorker pid=\d+")
RAY_GPU_IDS = ("duplicate-gpu", "no-gpu-visible", "invalid-device-ordinal")


def _ray_workers(d: Diagnosis) -> list[str]:
    if d.id not in RAY_GPU_IDS:
        return []
    line = next((e.text for e in d.evidence if _RAY_WORKER.search(e.text)), None)
    if line is None:
        return []
    return [f"The ranks are Ray Train workers (\"{line}\"): Ray gives each worker the GPUs its ScalingConfig "
            "reserves and sets CUDA_VISIBLE_DEVICES to them. Workers that share one GPU or see none were given a "
            "fraction of a GPU or none: use ScalingConfig(num_workers=N, use_gpu=True) (one GPU per worker, "
            "resources_per_worker={'GPU': 1}) with at most as many workers as GPUs, and let Ray Train pick the "
            "device (ray.train.torch.get_device()) instead of a hard-coded cuda:N."]


def _missing_script(d: Diagnosis) -> list[str]:
    if d.id != "script-not-found":
        return []
    out = []
    for script in d.details.get("script", ())[:2]:
        line = _line_with(d, script)
        if line is not None:
            out.append(f"The file the launcher was told to run, '{script}', does not exist where python was started "
                       f"(\"{line}\"): a relative path is resolved on each host, in the working directory the launcher "
                       "gives python there; give a path that exists on every node (an absolute one, on a shared "
                       "file system or copied to each).")
    return out


def _batch_arithmetic(d: Diagnosis) -> list[str]:
    """DeepSpeed's batch assertion prints the three values and the world size it checked: the product is the
    train_batch_size this launch needs, and the world size is how many processes the launcher started."""
    if d.id != "deepspeed-config-error":
        return []
    values = [d.details.get(k, []) for k in ("train_batch", "micro_batch", "grad_acc", "world_size")]
    if not all(values):
        return []
    train, micro, acc, world = (int(v[0]) for v in values)
    line = _line_with(d, f"{train} != {micro} * {acc} * {world}")
    if line is None:
        return []
    per_process = micro * acc
    meant = train // per_process if per_process and train % per_process == 0 and train >= per_process else 0
    written = f"{meant} process{'es' if meant != 1 else ''}" if meant else "another number of processes"
    return [f"\"{line}\": this launch has {world} process{'es' if world != 1 else ''} (world_size), so "
            f"train_batch_size must be {micro} * {acc} * {world} = {per_process * world}, not {train}; the "
            f"config's values fit {written}. Give only two of the three values (or 'auto' with the HF Trainer) "
            "so the third is derived from the number of processes."]


def _summary_head(d: Diagnosis) -> list[str]:
    """torchrun's failure summary cut after its head: `<NO_OTHER_FAILURES>` and no exit code found."""
    if d.id != "worker-failed" or d.details:
        return []
    line = _line_with(d, "<NO_OTHER_FAILURES>")
    if line is None:
        return []
    return [f"Only the head of torchrun's failure summary is here (\"{line.strip()}\"): the failing rank, its exit code "
            "and signal are in its 'Root Cause (first observed failure)' section below it, and that rank's own "
            "traceback is above it in the full log."]


def _fact(d: Diagnosis) -> str:
    """What a fact diagnosis (``hint_for``) adds to the diagnosis it sharpens: its cause and remedy, quoting
    its line."""
    line = d.evidence[0].text if d.evidence else ""
    return f"{d.signature.title} (\"{line}\"): {d.signature.cause} {d.signature.remedy}"


# Collective timeouts: the ranks that print one waited for a rank that does not.
TIMEOUT_IDS = ("nccl-timeout", "gloo-timeout")
MAX_LAGGING_HINTS = 2


def last_progress_lines(tail: bytes, at_file_start: bool, last_line: int, name: str,
                        file_rank: int | None) -> dict[int, tuple[str, int, str]]:
    """rank -> (input, line number, text) of the last line of each rank in ``tail`` (the input's last bytes)
    that shows its own progress: not NCCL's INFO lines, glog info/warnings or Python warnings
    (``phases.chatter``), not an error. A rank's lines are told by torchrun's ``[rankN]:`` prefix, or the
    whole input is one rank's (``file_rank``)."""
    lines, first_no = tail_lines(tail, at_file_start, last_line)
    out: dict[int, tuple[str, int, str]] = {}
    for i in range(len(lines) - 1, -1, -1):
        raw = lines[i].rstrip("\r")[:MAX_TAIL_LINE_CHARS]
        text = strip_paste(raw)
        prefix = LINE_PREFIX_RANK.match(text)
        rank = rank_int(prefix.group(1) or prefix.group(2) or prefix.group(3) or "") if prefix else file_rank
        if rank is None or rank in out:
            continue
        body = text[prefix.end():].strip() if prefix else text.strip()
        if not body or chatter(raw) or _LOUD.search(body):
            continue
        # tqdm redraws a bar with \r on one line: the last redraw is what the terminal showed.
        shown = body.rsplit("\r", 1)[-1].strip() or body
        out[rank] = (name, first_no + i, shown[:MAX_EVIDENCE_CHARS])
    return out


# An error line or a traceback's piece: not progress.
_LOUD = re.compile(r"Error|Exception|Traceback|^File \"|NCCL WARN|Watchdog|timed? ?out|Timeout|exitcode|SIG[A-Z]{2,5}")


def _lagging(d: Diagnosis, progress: dict[int, tuple[str, int, str]]) -> list[str]:
    if d.id not in TIMEOUT_IDS or not d.ranks:
        return []
    out = []
    for rank in sorted(set(progress) - d.ranks)[:MAX_LAGGING_HINTS]:
        name, line, text = progress[rank]
        out.append(f"Rank {rank} did not report this timeout; its last line of progress, \"{text}\" ({name}:{line}), "
                   "is what the other ranks were waiting behind: work that rank did alone (an evaluation, "
                   "tokenising or loading a dataset, saving a checkpoint) took longer than the timeout. Do that "
                   "work on every rank or before init_process_group, put a barrier after it, or raise the "
                   "process group's timeout.")
    return out


def add_hints(diagnoses: list[Diagnosis],
              progress: dict[int, tuple[str, int, str]] | None = None) -> list[Diagnosis]:
    """Attach what each diagnosis's own values say (see the module docstring) to its ``hints``; a fact
    (``hint_for``: NCCL bootstrapping over docker0) goes to the first diagnosis it sharpens and is never listed
    on its own. Returns the diagnoses without the facts."""
    out = []
    for d in diagnoses:
        if d.signature.hint_for:
            target = next((x for x in diagnoses if x.id in d.signature.hint_for), None)
            if target is not None and (hint := _fact(d)) not in target.hints:
                target.hints.append(hint)
            continue
        out.append(d)
    for d in out:
        for hint in (*_loopback(d), *_short_timeout(d), *_ray_workers(d), *_lagging(d, progress or {}),
                     *_missing_script(d), *_batch_arithmetic(d), *_summary_head(d)):
            if hint not in d.hints:
                d.hints.append(hint)
    return out
