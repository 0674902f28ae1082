"""`airgate selftest`: prove an installation, check by check, after it has started once.

    data_dir      the data directory's owner and modes; no secret readable by anyone else
    keys          the audit signer (and its pin), the API key store, the bundle signing key,
                  the local KMS key file
    bundles       every configured and imported bundle verifies (signature, validity, offline
                  window, encrypted-file digests), nothing decrypted
    audit_chain   the audit log verifies (`airgate audit verify`'s verifier)
    egress        the egress guard refuses a connection outside the allow-list; the offline
                  variables are set
    redis, postgresql, kms, otlp
                  each configured service answers (skipped when not configured)
    inference     one real request to the configured model, served in this process
    audit_record  the selftest itself, appended to the audit log as an admin action

Each check returns a `Finding`; `run_selftest` times them into `CheckResult`s and never lets
one failure stop the next.  Nothing here prints: `report` formats, the CLI prints.
"""

from .inference import PROMPT, Serve, ServeFailed
from .report import encode_json, line, summary
from .result import CheckResult, Finding, Status
from .runner import CHECKS, run_selftest

__all__ = [
    "CHECKS",
    "PROMPT",
    "CheckResult",
    "Finding",
    "Serve",
    "ServeFailed",
    "Status",
    "encode_json",
    "line",
    "run_selftest",
    "summary",
]
