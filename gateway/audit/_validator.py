"""Check a constructed Struct against its own `Meta` constraints, fast.

msgspec enforces `Meta` constraints only when decoding, and a decode round trip of an audit
event costs ~45 µs (each pattern is a Python regex search).  This compiles the checks once from
`msgspec.inspect.type_info`, so the declared types stay the single source of truth, and
remembers the strings a pattern already accepted (models, routes, key ids and sampling keys
repeat on every request), which brings a check to a few microseconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import msgspec
import msgspec.inspect as mi

__all__ = ["compile_validator"]

# a check returns None when the value is valid, else the path below it that is not ("" = itself)
_Check = Callable[[Any], str | None]
_MEMO_MAX = 4096


def _str_check(t: mi.StrType) -> _Check:
    pattern = re.compile(t.pattern) if t.pattern is not None else None
    lo, hi = t.min_length or 0, t.max_length
    seen: set[str] = set()

    def check(v: Any) -> str | None:
        if type(v) is not str:
            return ""
        if v in seen:
            return None
        if len(v) < lo or (hi is not None and len(v) > hi):
            return ""
        if pattern is not None and pattern.search(v) is None:
            return ""
        if len(v) <= 128:
            if len(seen) >= _MEMO_MAX:
                seen.clear()
            seen.add(v)
        return None

    return check


def _number_check(t: mi.IntType | mi.FloatType) -> _Check:
    kinds: tuple[type, ...] = (int,) if isinstance(t, mi.IntType) else (int, float)
    ge: float | None = t.ge
    le: float | None = t.le
    gt: float | None = t.gt
    lt: float | None = t.lt

    def check(value: Any) -> str | None:
        if type(value) is bool or not isinstance(value, kinds):
            return ""
        v = cast(float, value)
        if not math.isfinite(v):
            return ""
        if (ge is not None and v < ge) or (le is not None and v > le):
            return ""
        if (gt is not None and v <= gt) or (lt is not None and v >= lt):
            return ""
        return None

    return check


def _dict_check(t: mi.DictType) -> _Check:
    key, value, hi = _compile(t.key_type), _compile(t.value_type), t.max_length

    def check(v: Any) -> str | None:
        if type(v) is not dict or (hi is not None and len(v) > hi):
            return ""
        for k, item in v.items():
            if key(k) is not None:
                return "[...]"
            bad = value(item)
            if bad is not None:
                return f"[{k!r}]{bad}" if isinstance(k, str) else f"[...]{bad}"
        return None

    return check


def _union_check(t: mi.UnionType) -> _Check:
    nullable = any(isinstance(m, mi.NoneType) for m in t.types)
    members = [_compile(m) for m in t.types if not isinstance(m, mi.NoneType)]
    if len(members) == 1:  # `X | None`, the common case: keep X's path for the message
        only = members[0]
        return (lambda v: None if v is None else only(v)) if nullable else only

    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        for member in members:
            if member(v) is None:
                return None
        return ""

    return check


def _struct_check(t: mi.StructType) -> _Check:
    fields = [(f.name, _compile(f.type)) for f in t.fields]
    cls = t.cls

    def check(v: Any) -> str | None:
        if not isinstance(v, cls):
            return ""
        for name, field_check in fields:
            bad = field_check(getattr(v, name))
            if bad is not None:
                return f".{name}{bad}"
        return None

    return check


def _compile(t: mi.Type) -> _Check:
    if isinstance(t, mi.StrType):
        return _str_check(t)
    if isinstance(t, mi.IntType | mi.FloatType):
        return _number_check(t)
    if isinstance(t, mi.BoolType):
        return lambda v: None if type(v) is bool else ""
    if isinstance(t, mi.NoneType):
        return lambda v: None if v is None else ""
    if isinstance(t, mi.LiteralType):
        values = frozenset(t.values)
        return lambda v: None if type(v) is str and v in values else ""
    if isinstance(t, mi.DateTimeType):
        tz = t.tz
        return lambda v: (
            None if isinstance(v, datetime) and (tz is None or (v.tzinfo is not None) == tz) else ""
        )
    if isinstance(t, mi.DictType):
        return _dict_check(t)
    if isinstance(t, mi.UnionType):
        return _union_check(t)
    if isinstance(t, mi.StructType):
        return _struct_check(t)
    raise TypeError(f"no check for {type(t).__name__}")


def compile_validator(cls: type[msgspec.Struct]) -> Callable[[msgspec.Struct], str | None]:
    """A function returning None for a valid instance of `cls`, else the `$.path` of the first
    invalid field (never its value)."""
    check = _compile(mi.type_info(cls))

    def validate(obj: msgspec.Struct) -> str | None:
        bad = check(obj)
        return None if bad is None else "$" + bad

    return validate
