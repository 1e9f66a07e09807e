"""``python -m ddpdoctor``: what ``torchrun -m ddpdoctor check`` runs on every rank."""

from ddpdoctor.cli import entry

entry()
