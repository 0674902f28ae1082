"""Installs airgate's egress guard at the start of every Python child of a guarded process.

`gateway.egress.install` puts this directory first on PYTHONPATH and the allow-list in
AIRGATE_EGRESS_ALLOW; Python imports `sitecustomize` at start-up, before any code of the
child's own runs: vLLM's engine core (multiprocessing "spawn", vLLM's choice on CPUs and
once CUDA is up), its model workers, and any other Python child.  A forked child needs none
of this: it inherits the hook itself.  A child that cannot be guarded does not run.

Then whichever `sitecustomize` this one hides (later on sys.path) runs as it would have.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _guard() -> None:
    text = os.environ.get("AIRGATE_EGRESS_ALLOW")
    if not text:
        return
    try:
        from gateway.egress.allow_list import AllowList
        from gateway.egress.guard import install, report_to_parent

        install(AllowList.decode(text), on_denied=report_to_parent)
    except Exception as exc:
        sys.stderr.write(
            f"airgate: the egress guard cannot be installed in this Python child "
            f"({type(exc).__name__}: {exc}); it does not run unguarded\n"
        )
        sys.stderr.flush()
        os._exit(70)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_guard()
_chain()
