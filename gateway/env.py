"""Every environment variable airgate reads, in one place.

`AIRGATE_<SECTION>__<KEY>` overrides `[section] key` of the configuration file (values are TOML
scalars: `8`, `true`, `"text"`, or bare text); the names below are read directly.
"""

from __future__ import annotations

__all__ = ["CONFIG", "DATA_DIR", "DIRECT", "PREFIX"]

PREFIX = "AIRGATE_"
CONFIG = "AIRGATE_CONFIG"  # path of airgate.toml
DATA_DIR = "AIRGATE_DATA_DIR"  # data directory (models, later keys and the audit database)
DIRECT = frozenset({CONFIG, DATA_DIR})
