"""The base of the generated models: dataclasses that read themselves from
the protocol's JSON form and write themselves back.

The generated ``models.py`` only declares dataclasses and type aliases; the
conversion is done here, from their type hints:

- ``bytes`` is base64 in JSON (the protocol's ``Bytes``);
- a ``Model`` subclass is a JSON object; keys the class does not know are
  kept in ``_raw`` (the whole object as it came) and otherwise ignored, so a
  newer daemon's extra fields do not break an older client;
- ``X | None`` may be absent or ``null``; ``list[X]``, ``dict[str, X]``;
- ``Literal[...]`` values pass as they are (unknown values too);
- a ``Union`` of models (a Rust enum with data) picks the variant whose
  required keys are all present, preferring one that knows every key.

A field whose JSON name is not a Python identifier (``from``) is declared
``from_`` with ``metadata={"json": "from"}``.
"""

from __future__ import annotations

import base64
import dataclasses
import sys
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

M = TypeVar("M", bound="Model")

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        module = sys.modules.get(cls.__module__)
        h = typing.get_type_hints(cls, vars(module) if module else None)
        _HINTS[cls] = h
    return h


def _json_name(f: dataclasses.Field) -> str:
    return f.metadata.get("json", f.name)


class Model:
    """Base of every generated dataclass."""

    @classmethod
    def from_dict(cls: type[M], data: Any) -> M:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__} is a JSON object, not {type(data).__name__}")
        hints = _hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if not f.init:
                continue
            key = _json_name(f)
            if key in data:
                kwargs[f.name] = decode(hints.get(f.name, Any), data[key])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                # Required but absent: None rather than a TypeError, so an
                # answer that leaves out a field still reads.
                kwargs[f.name] = None
        obj = cls(**kwargs)
        object.__setattr__(obj, "_raw", data)
        return obj

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields that are ``None`` left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is None:
                continue
            out[_json_name(f)] = encode(v)
        return out

    @classmethod
    def json_fields(cls) -> dict[str, str]:
        """JSON name -> attribute name."""
        return {_json_name(f): f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def required_keys(cls) -> set[str]:
        return {
            _json_name(f)
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }

    @property
    def raw(self) -> dict[str, Any]:
        """The JSON object this was read from (``to_dict()`` if made here)."""
        return getattr(self, "_raw", None) or self.to_dict()


def encode(v: Any) -> Any:
    """A value in its JSON form."""
    if isinstance(v, Model):
        return v.to_dict()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, dict):
        return {k: encode(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    return v


def _is_union(tp: Any) -> bool:
    o = get_origin(tp)
    return o is Union or o is types.UnionType


def decode(tp: Any, v: Any) -> Any:
    """``v`` (decoded JSON) as type ``tp``; values that do not fit are
    returned as they are."""
    if v is None or tp is Any:
        return v
    if isinstance(tp, str):  # an unresolved forward reference
        return v
    origin = get_origin(tp)
    if _is_union(tp):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return decode(args[0], v)
        return _decode_union(args, v)
    if origin is Literal:
        return v
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        if not isinstance(v, list):
            return v
        args = get_args(tp)
        item = args[0] if args else Any
        return [decode(item, x) for x in v]
    if origin is dict or tp is dict:
        if not isinstance(v, dict):
            return v
        args = get_args(tp)
        val = args[1] if len(args) == 2 else Any
        return {k: decode(val, x) for k, x in v.items()}
    if tp is bytes:
        if isinstance(v, str):
            try:
                return base64.b64decode(v, validate=True)
            except ValueError:
                return v
        if isinstance(v, list) and all(isinstance(b, int) for b in v):
            return bytes(v)
        return v
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if isinstance(tp, type) and issubclass(tp, Model):
        return tp.from_dict(v) if isinstance(v, dict) else v
    return v


def _fits(tp: Any, v: Any) -> int:
    """How well ``v`` fits ``tp``: 0 not at all, 1 loosely, 2 exactly."""
    if _is_union(tp):
        return max((_fits(a, v) for a in get_args(tp)), default=0)
    origin = get_origin(tp)
    if origin is Literal:
        return 2 if v in get_args(tp) else 0
    if isinstance(tp, type) and issubclass(tp, Model):
        if not isinstance(v, dict):
            return 0
        if not tp.required_keys() <= v.keys():
            return 0
        # A tag (a field that can hold one constant) must match.
        hints = _hints(tp)
        for key, name in tp.json_fields().items():
            h = hints.get(name)
            if key in v and get_origin(h) is Literal and v[key] not in get_args(h):
                return 0
        return 2 if set(v) <= set(tp.json_fields()) else 1
    if tp is Any:
        return 1
    if tp is type(None):
        return 2 if v is None else 0
    simple = {
        str: str, int: int, float: (int, float), bool: bool, bytes: str,
    }.get(tp)
    if simple is not None:
        if tp in (int, float) and isinstance(v, bool):
            return 0
        return 2 if isinstance(v, simple) else 0
    if origin in (list, tuple) or tp in (list, tuple):
        return 2 if isinstance(v, list) else 0
    if origin is dict or tp is dict:
        return 1 if isinstance(v, dict) else 0
    return 1


def _decode_union(args: list[Any], v: Any) -> Any:
    best, score = None, 0
    for a in args:
        s = _fits(a, v)
        if s > score:
            best, score = a, s
            if s == 2:
                break
    return v if best is None else decode(best, v)
