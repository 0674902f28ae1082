"""`lint()`: everything `airgate policy check DIR` reports, as one line per finding.

Errors are the `PolicyError` text of every file that does not load (all files are tried, not
only the first bad one).  Warnings, for documents that did load, read
`<file>: rules[i]: warning: ...` and flag what loads but cannot be what the author meant:

- a rule no principal can reach, because earlier rules match every principal it matches
  (first match wins, see `policies.decide`); reported only when certain, so globs are compared
  literally (`*` covers everything, a glob covers a plain name it matches, a glob covers itself)
- a `document/rule` name used twice (decisions and audit rows name rules this way)
- a rule that matches the app role but allows no model and denies none: every request it
  decides is denied, which is easy to write by accident (`deny_models = ["*"]` says it on purpose)
- a document without rules

An empty list means the path is fit to deploy; the CLI exits non-zero on any finding.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fnmatch import fnmatchcase

from .errors import PolicyError
from .loader import policy_files, read_document
from .types import PolicyDocument, Rule

__all__ = ["lint", "lint_documents"]

_META = frozenset("*?[")


def _glob_covers(earlier: str, glob: str) -> bool:
    """Whether every name `glob` matches is certainly matched by `earlier`."""
    if earlier == glob or set(earlier) == {"*"}:
        return True
    return _META.isdisjoint(glob) and fnmatchcase(glob, earlier)


def _shadowed_by(rule: Rule, earlier: Sequence[tuple[str, Rule]]) -> list[str] | None:
    """The earlier rules that together match every principal `rule` matches, or None if some
    principal reaches `rule`.  A principal with a single role is the hardest to shadow, so it is
    enough to cover every (role, team glob) pair of `rule`."""
    shadowing: list[str] = []
    for role in rule.roles:
        for glob in rule.teams:
            cover = next(
                (
                    name
                    for name, other in earlier
                    if role in other.roles and any(_glob_covers(g, glob) for g in other.teams)
                ),
                None,
            )
            if cover is None:
                return None
            if cover not in shadowing:
                shadowing.append(cover)
    return shadowing


def lint_documents(documents: Sequence[tuple[str, PolicyDocument]]) -> list[str]:
    """Warnings for `(source, document)` pairs taken in evaluation order."""
    findings: list[str] = []
    earlier: list[tuple[str, Rule]] = []
    first_seen: dict[str, str] = {}
    for source, document in documents:
        if not document.rules:
            findings.append(f"{source}: warning: document {document.name!r} has no rules")
        for index, rule in enumerate(document.rules):
            name = f"{document.name}/{rule.name}"
            where = f"{source}: rules[{index}]"
            if name in first_seen:
                findings.append(
                    f"{where}: warning: rule name {name!r} is already used ({first_seen[name]})"
                )
            else:
                first_seen[name] = where
            shadowing = _shadowed_by(rule, earlier)
            if shadowing is not None:
                findings.append(
                    f"{where}: warning: rule {name!r} is unreachable: every principal it "
                    f"matches is matched first by {', '.join(repr(s) for s in shadowing)}"
                )
            if "app" in rule.roles and not rule.models and not rule.deny_models:
                findings.append(
                    f"{where}: warning: rule {name!r} matches the app role but allows no model, "
                    'so it denies every request it decides (write deny_models = ["*"] if that '
                    "is the intent)"
                )
            earlier.append((name, rule))
    return findings


def lint(path: str | os.PathLike[str]) -> list[str]:
    """Every error and warning for the policy directory or file at `path`."""
    try:
        files = policy_files(path)
    except PolicyError as exc:
        return [str(exc)]
    findings: list[str] = []
    loaded: list[tuple[str, PolicyDocument]] = []
    for file in files:
        try:
            loaded.append((file.name, read_document(file)))
        except PolicyError as exc:
            findings.append(str(exc))
    return findings + lint_documents(loaded)
