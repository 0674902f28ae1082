"""Policy errors.  Loading is the only thing that raises: `decide()` answers every request with a
`Decision`, denials included, and never raises.

    PolicyError          a policy file or directory cannot be loaded: missing, not TOML, or a
                         value that does not fit the schema; `file` and `key` say where

Messages name the file and the key (`team-a.toml: rules[2].max_tokens: Expected int >= 1`) and
never contain request content.
"""

from __future__ import annotations

__all__ = ["PolicyError"]


class PolicyError(Exception):
    """A policy file or directory cannot be loaded.

    `file` is the file's name (or the path given, when there is no file to name) and `key` the
    dotted key inside it (`rules[2].max_tokens`, 0-based like msgspec and jq), or None when the
    whole file is at fault.
    """

    def __init__(self, file: str, message: str, *, key: str | None = None) -> None:
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + message)
        self.file = file
        self.key = key
