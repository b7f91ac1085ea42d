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
from typing import Any, Callable, Literal, TypeVar, Union, get_args, get_origin

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
        plan = _PLANS.get(cls) or _plan(cls)
        if plan.direct:
            # The dataclass's __init__ would only assign the fields: do it
            # here, with each field converted by the plan made once per class.
            obj = cls.__new__(cls)
            d = obj.__dict__
            for name, key, conv, has_default, default, factory in plan.fields:
                if key in data:
                    v = data[key]
                    d[name] = v if conv is None or v is None else conv(v)
                elif factory is not None:
                    d[name] = factory()
                else:
                    # Required but absent: None rather than a TypeError, so an
                    # answer that leaves out a field still reads.
                    d[name] = default
            d["_raw"] = data
            return obj
        kwargs: dict[str, Any] = {}
        for name, key, conv, has_default, default, factory in plan.fields:
            if key in data:
                v = data[key]
                kwargs[name] = v if conv is None or v is None else conv(v)
            elif not has_default:
                kwargs[name] = None
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
        plan = _PLANS.get(cls) or _plan(cls)
        return dict(plan.json_fields)

    @classmethod
    def required_keys(cls) -> set[str]:
        plan = _PLANS.get(cls) or _plan(cls)
        return set(plan.required)

    @property
    def raw(self) -> dict[str, Any]:
        """The JSON object this was read from (``to_dict()`` if made here)."""
        return getattr(self, "_raw", None) or self.to_dict()


class _Plan:
    """How a model class reads itself: per field its attribute, its JSON
    key, the converter of its values (``None``: taken as they are) and its
    default; made once per class from its type hints."""

    __slots__ = ("fields", "direct", "json_fields", "required", "literal_keys")

    def __init__(self, cls: type) -> None:
        hints = _hints(cls)
        fields = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if not f.init:
                continue
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            default = f.default if f.default is not dataclasses.MISSING else None
            fields.append((f.name, _json_name(f), converter(hints.get(f.name, Any)), has_default, default, factory))
        self.fields = tuple(fields)
        params = getattr(cls, "__dataclass_params__", None)
        # Assigning the fields straight into __dict__ is what __init__ does
        # for a plain dataclass; not for a frozen one, one with slots or a
        # __post_init__.
        self.direct = (
            params is not None and not params.frozen and "__slots__" not in vars(cls)
            and not hasattr(cls, "__post_init__") and all(f.init for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        )
        self.json_fields = {key: name for name, key, *_ in fields}
        self.required = frozenset(key for name, key, conv, has_default, *_ in fields if not has_default)
        #: Keys whose field can hold only given constants (a tag).
        self.literal_keys = {
            key: get_args(hints[name]) for name, key, *_ in fields if get_origin(hints.get(name)) is Literal
        }


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    p = _PLANS[cls] = _Plan(cls)
    return p


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
    conv = converter(tp)
    return v if conv is None else conv(v)


_CONVERTERS: dict[Any, Callable[[Any], Any] | None] = {}


def converter(tp: Any) -> Callable[[Any], Any] | None:
    """The function reading a (non-``None``) JSON value as type ``tp``, or
    ``None`` when the value is taken as it is; made once per type."""
    try:
        return _CONVERTERS[tp]
    except KeyError:
        pass
    except TypeError:  # an unhashable type form
        return _converter(tp)
    conv = _CONVERTERS[tp] = _converter(tp)
    return conv


def _b64(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except ValueError:
            return v
    if isinstance(v, list) and all(isinstance(b, int) for b in v):
        return bytes(v)
    return v


def _to_float(v: Any) -> Any:
    return float(v) if type(v) is int else v


def _converter(tp: Any) -> Callable[[Any], Any] | None:
    if tp is Any or isinstance(tp, str):  # Any, or an unresolved forward reference
        return None
    origin = get_origin(tp)
    if _is_union(tp):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return converter(args[0])
        return lambda v: _decode_union(args, v)
    if origin is Literal:
        return None
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        args = get_args(tp)
        item = converter(args[0]) if args else None
        if item is None:
            return lambda v: list(v) if isinstance(v, list) else v
        return lambda v: [x if x is None else item(x) for x in v] if isinstance(v, list) else v
    if origin is dict or tp is dict:
        args = get_args(tp)
        val = converter(args[1]) if len(args) == 2 else None
        if val is None:
            return lambda v: dict(v) if isinstance(v, dict) else v
        return lambda v: {k: x if x is None else val(x) for k, x in v.items()} if isinstance(v, dict) else v
    if tp is bytes:
        return _b64
    if tp is float:
        return _to_float
    if isinstance(tp, type) and issubclass(tp, Model):
        return lambda v: tp.from_dict(v) if isinstance(v, dict) else v
    return None


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
        plan = _PLANS.get(tp) or _plan(tp)
        if not plan.required <= v.keys():
            return 0
        # A tag (a field that can hold one constant) must match.
        for key, allowed in plan.literal_keys.items():
            if key in v and v[key] not in allowed:
                return 0
        return 2 if v.keys() <= plan.json_fields.keys() else 1
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
