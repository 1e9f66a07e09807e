"""`ddpdoctor unused` and the unused_params check: which parameters get no gradient, which model outputs feed no
loss, and is the model the same on every rank.

DDP's reducer waits, every iteration, for a gradient of every parameter that requires one; a parameter
that gets none makes the *next* iteration fail with "Expected to have finished reduction in the prior
iteration before starting a new one" (or hang when ranks disagree). ``find_unused_parameters=True`` fixes
that by walking the autograd graph every step, which costs time on every step, so users should only pay
for it when the model needs it. This package finds out by running the model: forward and backward on a deep
copy, counting with ``register_post_accumulate_grad_hook`` how often each parameter's gradient is
accumulated per backward (the same event DDP's reducer hooks), so the caller's model, its gradients, its
buffers, its train/eval mode and the RNG state are left exactly as they were.

Behaviour of DDP that the recommendations rely on (checked with torch 2.13 on gloo; see the unused section of README.md):
a parameter never used by ``forward`` works with ``static_graph=True`` or ``find_unused_parameters=True``;
a parameter used on some steps (or some ranks) needs ``find_unused_parameters=True``; a parameter that only
feeds an output left out of the loss needs ``find_unused_parameters=True`` (``static_graph=True`` fails,
because DDP expects every parameter reachable from the outputs); a parameter accumulated twice in one
backward (reentrant checkpointing) raises "Expected to mark a variable ready only once" unless
``static_graph=True`` (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html).

The package: :mod:`~ddpdoctor.unused.report` (what is found, as text and JSON),
:mod:`~ddpdoctor.unused.isolation` (a copy of the model, the caller's RNG restored),
:mod:`~ddpdoctor.unused.batches` (inputs, forward, loss, the autograd graph),
:mod:`~ddpdoctor.unused.analysis` (the counting and the recommendation) and
:mod:`~ddpdoctor.unused.consistency` (fingerprints compared across ranks).
"""

from __future__ import annotations

from ddpdoctor.unused.analysis import find_unused_parameters, recommend
from ddpdoctor.unused.batches import batch_source, random_batches
from ddpdoctor.unused.consistency import ModelDifference, TensorPrint, compare_fingerprints, fingerprint
from ddpdoctor.unused.report import DeadOutput, ParamUse, Recommendation, UnusedReport

__all__ = ["DeadOutput", "ModelDifference", "ParamUse", "Recommendation", "TensorPrint", "UnusedReport",
           "batch_source", "compare_fingerprints", "find_unused_parameters", "fingerprint", "random_batches",
           "recommend"]
