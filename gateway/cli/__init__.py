"""The `airgate` command: `main` builds the typer app from the subcommand modules.

main     serve, and the root command
admin    keys, policy, audit, db
bundles  bundle, signing-key, kms
run      run, ls, ps: a terminal chat and model lists, as clients of a running server
selftest selftest: the installation's check, by `gateway.selftest`
common   options and failure reporting every subcommand shares
"""

from .main import main

__all__ = ["main"]
