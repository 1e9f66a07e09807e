"""One module per command family: module-level command functions and ``register(app)``, which adds them
(``app.command("name")(fn)``); shared options are declared once in :mod:`~ddpdoctor.commands.options`. No
module imports torch at import time."""
