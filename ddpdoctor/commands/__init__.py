"""One module per command family; each exposes ``register(app)`` and imports no torch at import time."""
