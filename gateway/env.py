"""Every environment variable airgate reads, in one place.

`AIRGATE_<SECTION>__<KEY>` overrides `[section] key` of the configuration file (values are TOML
scalars: `8`, `true`, `"text"`, or bare text); the names below are read directly.  Secrets
named by the configuration (`[kms.pkcs11] pin_env`, `[kms.vault_transit] token_env`) are read
from the variables it names.
"""

from __future__ import annotations

__all__ = [
    "API_KEY",
    "CONFIG",
    "CREDENTIALS_DIRECTORY",
    "DATA_DIR",
    "DIRECT",
    "EGRESS_ALLOW",
    "EGRESS_REPORT",
    "HOST",
    "OFFLINE",
    "PEPPER",
    "PREFIX",
]

PREFIX = "AIRGATE_"
CONFIG = "AIRGATE_CONFIG"  # path of airgate.toml
DATA_DIR = "AIRGATE_DATA_DIR"  # data directory (models, later keys and the audit database)
PEPPER = "AIRGATE_PEPPER"  # the API key pepper shared by replicas (hex or base64 of 32 bytes)
# read by the client commands (`airgate run`, `ls`, `ps`, `audit witness`), never by `serve`
API_KEY = "AIRGATE_API_KEY"  # the API key a client command sends as its bearer token
HOST = "AIRGATE_HOST"  # the server a client command talks to (default http://127.0.0.1:8000)
# set by `serve` for its children (the egress guard, gateway/egress): the allow-list the guard
# installs in every Python child at start, and the socket a child reports a refusal to
EGRESS_ALLOW = "AIRGATE_EGRESS_ALLOW"
EGRESS_REPORT = "AIRGATE_EGRESS_REPORT"
DIRECT = frozenset({CONFIG, DATA_DIR, PEPPER, API_KEY, HOST, EGRESS_ALLOW, EGRESS_REPORT})
# set by `serve` for itself and every child: third-party phone-home off (Hugging Face Hub,
# transformers, vLLM's usage statistics, and everything that honours DO_NOT_TRACK)
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# systemd's (LoadCredential=): `${CREDENTIALS_DIRECTORY}/name` in a secret file's path
CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
