"""Integrity: verify the audit log (the function the API and the CLI run) and say what it
found in plain words, per chain: intact or not, the first bad sequence number and why, gaps,
checkpoints checked, witnesses; and each chain's latest checkpoints with their signer key ids
(marked when the key is one this server pins).

Verification runs inside the POST that asks for it, and the page streams: each chain's progress
as its rows are read, then the outcome with its duration (`verifying.py`).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, Final

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.response import Stream

from ..access.stack import Security
from ..audit import LogReport
from ..audit.checkpoint import Checkpoint
from ..audit.verify import chains
from ..audit.witness import WitnessError, collect
from ..errors import ServiceUnavailable
from .checkpoints import latest
from .verifying import verification
from .web import Viewer, form_of, render_page, secure, viewed

__all__ = ["REASONS", "integrity_page", "run_verification"]

REASONS: Final[dict[str, str]] = {
    "gap": "rows are missing here (deleted, or never written)",
    "prev_hash_mismatch": "this row does not link to the row before it (a row was removed, "
    "inserted or reordered)",
    "row_hash_mismatch": "this row's content no longer matches its hash (it was edited)",
    "body_invalid": "this row's stored event cannot be read (it was edited or damaged)",
    "column_mismatch": "this row's search columns disagree with its stored event (edited)",
    "checkpoint_missing": "a signed checkpoint is missing from the chain of checkpoints",
    "checkpoint_link_mismatch": "a checkpoint does not link to the one before it",
    "checkpoint_range_invalid": "a checkpoint covers an impossible range of rows",
    "checkpoint_bad_signature": "a checkpoint's signature is invalid (forged or edited)",
    "checkpoint_untrusted_key": "a checkpoint is signed by a key this server does not pin",
    "checkpoint_root_mismatch": "the rows no longer hash to the tree root a checkpoint signed "
    "(rows were rewritten, even if their hashes were recomputed)",
    "unsigned_row": "a row after the last signed checkpoint (inserted by someone other than "
    "the writer)",
    "no_checkpoint": "nothing in this log is signed",
    "no_trusted_key": "no checkpoint key is pinned in the configuration, so no signature can "
    "be trusted",
    "append_only_missing": "the database triggers that keep the log append-only were removed",
    "witness_truncated": "the log is shorter than a size a witness holds (rows were cut off)",
    "witness_diverged": "the log's first rows differ from what a witness saw (history was "
    "rewritten)",
    "witness_rolled_back": "a witness holds a later epoch than the log (the log was rolled back)",
    "witness_untrusted": "a witness holds a checkpoint not signed by a pinned key",
}


def _when(ts_us: int) -> str:
    return datetime.fromtimestamp(ts_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


async def _checkpoints(security: Security) -> list[tuple[str, list[Checkpoint]]]:
    return [(name, await latest(security.engine, name)) for name in await chains(security.engine)]


def _context(security: Security, shown: list[tuple[str, list[Checkpoint]]]) -> dict[str, Any]:
    return {
        "checkpoints": shown,
        "trusted": sorted(k.key_id for k in security.trusted_audit_keys),
        "when": _when,
        "reasons": REASONS,
    }


@get("/integrity", name="console.integrity")
async def integrity_page(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """The chains' latest checkpoints and the button that runs verification."""
    shown = await _checkpoints(security)
    await viewed(request, security, viewer, "console.integrity", detail={"chains": len(shown)})
    context = {**_context(security, shown), "report": None, "running": False}
    return render_page(request, "integrity.html", context, viewer=viewer)


@post("/integrity", name="console.verify", status_code=200)
async def run_verification(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Stream:
    """Verify every chain against the pinned keys and the witnesses: the page streams each
    chain's progress, then the findings (`verifying.py`)."""
    await form_of(request, security, viewer, "audit.verify")
    try:
        witnessed = await asyncio.to_thread(collect, security.audit.witnesses, None)
    except WitnessError:
        raise ServiceUnavailable(
            "a witness could not be read; check [audit] witness_dir and retry"
        ) from None
    shown = await _checkpoints(security)

    def context(report: LogReport | None) -> dict[str, Any]:
        return {**_context(security, shown), "report": report, "running": True}

    stream = Stream(
        verification(request, security, viewer, witnessed, context), media_type="text/html"
    )
    secure(stream)
    return stream
