"""Every environment variable airgate reads, in one place.

`AIRGATE_<SECTION>__<KEY>` overrides `[section] key` of the configuration file (values are TOML
scalars: `8`, `true`, `"text"`, or bare text); the names below are read directly.  Secrets
named by the configuration (`[kms.pkcs11] pin_env`, `[kms.vault_transit] token_env`) are read
from the variables it names.
"""

from __future__ import annotations

__all__ = ["CONFIG", "CREDENTIALS_DIRECTORY", "DATA_DIR", "DIRECT", "PEPPER", "PREFIX"]

PREFIX = "AIRGATE_"
CONFIG = "AIRGATE_CONFIG"  # path of airgate.toml
DATA_DIR = "AIRGATE_DATA_DIR"  # data directory (models, later keys and the audit database)
PEPPER = "AIRGATE_PEPPER"  # the API key pepper shared by replicas (hex or base64 of 32 bytes)
DIRECT = frozenset({CONFIG, DATA_DIR, PEPPER})
# systemd's (LoadCredential=): `${CREDENTIALS_DIRECTORY}/name` in a secret file's path
CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
