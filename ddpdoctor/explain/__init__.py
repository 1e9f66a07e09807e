"""`ddpdoctor explain`: recognise the messages a distributed PyTorch job prints, and order them root cause first.

The knowledge comes from the sources that print the messages (PyTorch's torch.distributed and c10d, torchrun,
NCCL, gloo, Lightning, accelerate, DeepSpeed, the HF Trainer): ``tests/data/explain_inventory/`` lists every
message with its provenance, and a coverage test checks that each failure message maps to a signature.

* :mod:`.knowledge`: the signatures (``kb.json``) and their causal links;
* :mod:`.prefilter`: which lines can hold a known message, found at C speed;
* :mod:`.scanner`: streams the inputs, matches keyword lines, keeps bounded per-signature and per-rank facts;
* :mod:`.phases`: where each input ends (inside torchrun's rendezvous, the store, the store barrier,
  NCCL's init, with nothing after it);
* :mod:`.ranking`: orders the diagnoses root cause first, by evidence (causal links, errors before warnings,
  which rank ended first), and makes the probable hang;
* :mod:`.inventory`: the message inventory's model, templates turned into example lines, coverage figures;
* :mod:`.rendering`: the text report.

Never imports torch.
"""

from __future__ import annotations

from ddpdoctor.explain.inputs import error_file_text, explain_streams, explain_text
from ddpdoctor.explain.knowledge import ROLE_ORDER, Signature, load_kb
from ddpdoctor.explain.lines import rank_from_path
from ddpdoctor.explain.model import Diagnosis, Evidence, ExplainResult
from ddpdoctor.explain.rendering import render_text
from ddpdoctor.explain.scanner import Scanner

__all__ = ["ROLE_ORDER", "Diagnosis", "Evidence", "ExplainResult", "Scanner", "Signature", "error_file_text",
           "explain_streams", "explain_text", "load_kb", "rank_from_path", "render_text"]
