"""Enrolled devices: which key may vouch for which laptop's chain.

A laptop (`airgate device enroll`) writes an enrolment request: its device id, the id of its
audit chain (`log_id`) and the public key its checkpoints are signed with; no secret.  HQ pins
the requests it accepts in configuration (`[audit] devices`: files, or the JSON text inline),
never in the database, which an insider can write.

An enrolled key is bound to its device's chain: `chain_keys` gives verification, for a chain,
the keys of the device that owns it and nothing else, and for every other chain (HQ's own
replicas) the pinned `[audit] trusted_keys` and never a device's.  So a laptop's key can vouch
for that laptop's rows only, and HQ's keys never for a laptop's.  Enrolling a second request
for the same device and chain adds a key (a laptop whose key was rotated); one device id with
two chains, or one chain claimed by two devices, is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from bundles import SigningKeyError
from bundles.kms.signer import VerifyKey, parse_verify_key

__all__ = [
    "DEVICE_ID",
    "ENROLMENT_FORMAT",
    "DeviceKey",
    "Enrolment",
    "EnrolmentError",
    "chain_keys",
    "device_keys",
    "encode_enrolment",
    "read_enrolments",
]

ENROLMENT_FORMAT: Final = "airgate-device-enrolment/1"
DEVICE_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?!\n)$"  # a host name's alphabet
DeviceId = Annotated[str, Meta(pattern=DEVICE_ID)]
LogId = Annotated[str, Meta(pattern=r"^[0-9a-f]{16,32}(?!\n)$")]
KeyId = Annotated[str, Meta(pattern=r"^[0-9a-f]{16}(?!\n)$")]
_encoder = msgspec.json.Encoder(order="sorted")


class EnrolmentError(ValueError):
    """An enrolment that cannot be used; the message names the entry, never its text."""


class Enrolment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A laptop's enrolment request (`airgate device enroll`), as HQ pins it."""

    format: Literal["airgate-device-enrolment/1"]
    device_id: DeviceId
    log_id: LogId  # the laptop's audit chain
    key_id: KeyId  # of public_key (checked)
    public_key: str  # ed25519:... or ecdsa-p256:... (the laptop's audit signer)
    created: Annotated[datetime, Meta(tz=True)]


def encode_enrolment(enrolment: Enrolment) -> bytes:
    """Canonical JSON, one line."""
    return _encoder.encode(enrolment)


class DeviceKey(VerifyKey):
    """An enrolled device's key: trusted only for the device's own chain (`chain_keys`)."""

    __slots__ = ("device_id", "log_id")

    def __init__(self, key: VerifyKey, device_id: str, log_id: str) -> None:
        super().__init__(key._public)  # the same public key, bound to one chain
        self.device_id = device_id
        self.log_id = log_id

    def __repr__(self) -> str:
        return f"DeviceKey({self.alg}, {self.key_id}, device={self.device_id})"


def _entry_text(entry: str, index: int) -> bytes:
    if entry.lstrip().startswith("{"):
        return entry.encode("utf-8")
    try:
        return Path(entry).read_bytes()
    except OSError as exc:
        raise EnrolmentError(
            f"[audit] devices entry {index + 1}: the enrolment file cannot be read "
            f"({type(exc).__name__})"
        ) from None


def _parse(data: bytes, index: int) -> tuple[Enrolment, VerifyKey]:
    where = f"[audit] devices entry {index + 1}"
    try:
        enrolment = msgspec.json.decode(data, type=Enrolment)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EnrolmentError(
            f"{where} is not an enrolment request (`airgate device enroll` writes one): {exc}"
        ) from None
    try:
        key = parse_verify_key(enrolment.public_key)
    except SigningKeyError:
        raise EnrolmentError(f"{where}: its public_key is not a key") from None
    if key.key_id != enrolment.key_id:
        raise EnrolmentError(f"{where}: its key_id is not the id of its public_key")
    return enrolment, key


def read_enrolments(entries: Sequence[str]) -> list[tuple[Enrolment, VerifyKey]]:
    """The `[audit] devices` entries (files, or inline JSON text), parsed and checked: each
    device has one chain and each chain one device.  Raises `EnrolmentError`."""
    parsed = [_parse(_entry_text(entry, i), i) for i, entry in enumerate(entries)]
    chain_of: dict[str, str] = {}
    device_of: dict[str, str] = {}
    for enrolment, _ in parsed:
        device, log_id = enrolment.device_id, enrolment.log_id
        if chain_of.setdefault(device, log_id) != log_id:
            raise EnrolmentError(f"[audit] devices: device {device} is enrolled with two chains")
        if device_of.setdefault(log_id, device) != device:
            raise EnrolmentError(
                f"[audit] devices: devices {device_of[log_id]} and {device} claim one chain"
            )
    return parsed


def device_keys(entries: Sequence[str]) -> list[DeviceKey]:
    """Every enrolled key, bound to its device's chain."""
    return [DeviceKey(key, e.device_id, e.log_id) for e, key in read_enrolments(entries)]


def chain_keys(keys: Iterable[VerifyKey], log_id: str) -> tuple[list[VerifyKey], str | None]:
    """The keys that may vouch for chain `log_id`, and the device that owns it (None: one of
    HQ's own chains, for which only keys that are not a device's count)."""
    keys = list(keys)
    bound = [k for k in keys if isinstance(k, DeviceKey) and k.log_id == log_id]
    if bound:
        return list(bound), bound[0].device_id
    return [k for k in keys if not isinstance(k, DeviceKey)], None
