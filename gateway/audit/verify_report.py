"""What verification reports: per chain (`VerifyReport`) and for the whole log (`LogReport`),
with the reasons a finding can name (`verify.py` says what each proves)."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "CHAIN_REASONS",
    "MAX_PROBLEMS",
    "EpochLoss",
    "LogReport",
    "Problem",
    "Reason",
    "VerifyReport",
    "WitnessReport",
]

Reason = Literal[
    "gap",
    "prev_hash_mismatch",
    "row_hash_mismatch",
    "body_invalid",
    "column_mismatch",
    "checkpoint_missing",
    "checkpoint_link_mismatch",
    "checkpoint_range_invalid",
    "checkpoint_bad_signature",
    "checkpoint_untrusted_key",
    "checkpoint_root_mismatch",
    "unsigned_row",
    "no_checkpoint",
    "no_trusted_key",
    "append_only_missing",
    "witness_truncated",
    "witness_diverged",
    "witness_rolled_back",
    "witness_untrusted",
]
CHAIN_REASONS = frozenset(
    {"gap", "prev_hash_mismatch", "row_hash_mismatch", "body_invalid", "column_mismatch"}
)
MAX_PROBLEMS = 1000


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One finding: the seq it concerns (0: the log as a whole) and why."""

    seq: int
    reason: Reason
    checkpoint_id: int | None = None
    witness: str | None = None
    witnessed_size: int | None = None


class WitnessReport(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    checkpoints: int  # of this log
    latest_epoch: int | None
    latest_size: int | None
    ok: bool


class EpochLoss(msgspec.Struct, frozen=True, kw_only=True):
    """A declared loss: a witnessed epoch reached `witnessed_size`, the next began at
    `resumed_at`."""

    epoch: int
    witnessed_size: int
    resumed_at: int


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """One chain's verification."""

    ok: bool  # no problem at all
    log_id: str  # the chain
    epoch: int | None
    first_seq: int | None  # the range examined (None: the log is empty)
    last_seq: int | None
    rows: int  # rows read in the range
    gaps: list[tuple[int, int]]  # missing seq ranges, inclusive
    chain_ok: bool
    tree_checked: bool
    first_bad_seq: int | None
    reason: Reason | None  # why first_bad_seq is bad
    problems: list[Problem]  # in seq order, at most MAX_PROBLEMS
    problem_count: int
    trusted_keys: list[str]  # the key ids signatures were checked against
    checkpoints_checked: int
    checkpoints_failed: int
    checkpoints_untrusted: int
    witnesses: list[WitnessReport]
    epoch_losses: list[EpochLoss]
    chain_only_from: int | None  # first row after the last checkpoint (always a problem)
    chain_only_rows: int
    device: str | None = None  # the enrolled device whose chain this is (None: HQ's own)


class LogReport(msgspec.Struct, frozen=True, kw_only=True):
    """Every chain's verification: the log is intact when each chain is (and it has one)."""

    ok: bool
    chains: list[VerifyReport]
    problem_count: int
    trusted_keys: list[str]
