#!/usr/bin/env python3
"""Writes ``allox/models.py`` from an OpenAPI 3.1 document.

    python3 tools/gen_models.py http://127.0.0.1:8092/v1/openapi.json --token-file /run/allox/gateway.token
    python3 tools/gen_models.py openapi.json [-o allox/models.py]

One dataclass (a subclass of ``allox._model.Model``) per object schema in
``components.schemas``; other schemas become type aliases:

- ``properties`` and ``required``: a field per property, required ones
  without a default; the others take the schema's ``default``, else ``None``;
- ``type: [X, "null"]``, ``anyOf``/``oneOf`` with a ``{"type": "null"}``
  member: ``Optional[X]``;
- ``enum`` and string ``const`` members: ``Literal[...]``;
- ``array``: ``list[X]``; an object with only ``additionalProperties``:
  ``dict[str, X]``; a string with ``format: byte`` or ``contentEncoding:
  base64``: ``bytes``;
- ``$ref: "#/components/schemas/Name"`` (also ``#/$defs/Name``): ``Name``;
- ``oneOf``/``anyOf`` of several: ``Union[...]``; an object member inline
  (a Rust enum variant with data, ``{"variant": {...}}``) becomes a class of
  its own, named after the enum and the variant.

Each path ``/v1/rpc/{action}`` adds ``ACTIONS[action] = (params type,
result type)`` from its request body and its 200 answer's ``result``.

Only the standard library is needed for a file; a URL is fetched with
``urllib`` (the gateway wants the bearer token: ``--token`` or
``--token-file``).
"""

from __future__ import annotations

import argparse
import base64
import json
import keyword
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "allox" / "models.py"

# Names the generated module uses itself.
RESERVED_NAMES = {
    "Any", "Literal", "Optional", "Union", "Model", "dataclass", "field",
    "ACTIONS", "SCHEMAS", "annotations",
}
# Attributes of Model a field may not shadow.
RESERVED_FIELDS = {"from_dict", "to_dict", "raw", "json_fields", "required_keys"}


def camel(s: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", s)
    out = "".join(p[:1].upper() + p[1:] for p in parts if p)
    return out or "X"


def class_name(s: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", s)
    if not name or name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name) or name in RESERVED_NAMES:
        name += "_"
    return name


def field_name(s: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", s)
    if not name or name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in RESERVED_FIELDS:
        name += "_"
    return name


def is_null(s: Any) -> bool:
    return isinstance(s, dict) and (s.get("type") == "null" or s.get("const", 0) is None and "const" in s)


def is_str_const(s: Any) -> bool:
    if not isinstance(s, dict):
        return False
    if "const" in s and isinstance(s["const"], str):
        return True
    e = s.get("enum")
    return isinstance(e, list) and e and all(isinstance(x, str) for x in e) and s.get("type", "string") == "string"


def str_consts(s: dict) -> list[str]:
    return [s["const"]] if "const" in s else list(s["enum"])


def quote_names(expr: str, names: set[str]) -> str:
    """``expr`` with each of ``names`` (outside string literals) quoted."""
    if not names:
        return expr
    parts = re.split(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", expr)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"[A-Za-z_]\w*", lambda m: repr(m.group(0)) if m.group(0) in names else m.group(0), parts[i])
    return "".join(parts)


def py_literal(v: Any) -> str:
    return repr(v)


def docstring(text: str, indent: str) -> list[str]:
    text = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = text.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}'] + [f"{indent}{l}".rstrip() for l in lines[1:]] + [f'{indent}"""']


class Generator:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        comps = doc.get("components") or {}
        self.schemas: dict[str, Any] = dict(comps.get("schemas") or {})
        # Some documents keep definitions in $defs as well.
        for k, v in (doc.get("$defs") or {}).items():
            self.schemas.setdefault(k, v)
        self.names = {n: class_name(n) for n in self.schemas}
        self.used = set(self.names.values())
        # name -> (description, [(field, json, annotation, default, description)])
        self.classes: dict[str, tuple[str | None, list[tuple[str, str, str, str | None, str | None]]]] = {}
        # name -> (expression, description)
        self.aliases: dict[str, tuple[str, str | None]] = {}
        self.actions: dict[str, tuple[str, str]] = {}
        self.pending: set[str] = set()

    # -- names ---------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        name = class_name(hint)
        base, n = name, 2
        while name in self.used:
            name = f"{base}{n}"
            n += 1
        self.used.add(name)
        return name

    def ref(self, ref: str) -> str:
        key = ref.rsplit("/", 1)[-1]
        key = key.replace("~1", "/").replace("~0", "~")
        if key not in self.names:
            raise SystemExit(f"gen_models: unresolved $ref {ref!r}")
        return self.names[key]

    def resolve(self, s: Any) -> Any:
        while isinstance(s, dict) and "$ref" in s and len(s) == 1:
            key = s["$ref"].rsplit("/", 1)[-1]
            s = self.schemas.get(key, {})
        return s

    # -- types ---------------------------------------------------------------

    def type_of(self, s: Any, hint: str) -> str:
        if s is True or s is None or s == {}:
            return "Any"
        if s is False:
            return "Any"
        if not isinstance(s, dict):
            return "Any"
        if "$ref" in s:
            return self.ref(s["$ref"])
        if "allOf" in s:
            members = [m for m in s["allOf"] if m not in ({}, True)]
            if len(members) == 1:
                return self.type_of(members[0], hint)
            # An intersection: the first object member stands for it.
            return self.type_of(members[0], hint) if members else "Any"
        for key in ("oneOf", "anyOf"):
            if key in s:
                return self.union(s[key], hint, nullable=False)
        t = s.get("type")
        if isinstance(t, list):
            nullable = "null" in t
            rest = [x for x in t if x != "null"]
            if not rest:
                return "None"
            inner = [self.type_of({**s, "type": x}, hint) for x in rest]
            expr = inner[0] if len(inner) == 1 else f"Union[{', '.join(dict.fromkeys(inner))}]"
            return f"Optional[{expr}]" if nullable else expr
        if "enum" in s:
            vals = s["enum"]
            nonnull = [v for v in vals if v is not None]
            expr = f"Literal[{', '.join(py_literal(v) for v in nonnull)}]" if nonnull else "None"
            return f"Optional[{expr}]" if None in vals and nonnull else expr
        if "const" in s:
            return "None" if s["const"] is None else f"Literal[{py_literal(s['const'])}]"
        if t == "string":
            if s.get("format") == "byte" or s.get("contentEncoding") == "base64":
                return "bytes"
            return "str"
        if t == "integer":
            return "int"
        if t == "number":
            return "float"
        if t == "boolean":
            return "bool"
        if t == "null":
            return "None"
        if t == "array":
            items = s.get("items")
            if isinstance(items, dict) or items is True:
                return f"list[{self.type_of(items, hint + 'Item')}]"
            return "list[Any]"
        if t == "object" or "properties" in s:
            if s.get("properties"):
                name = self.fresh(hint)
                self.add_class(name, s)
                return name
            extra = s.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                return f"dict[str, {self.type_of(extra, hint + 'Value')}]"
            return "dict[str, Any]"
        return "Any"

    def union(self, members: list[Any], hint: str, nullable: bool) -> str:
        nulls = [m for m in members if is_null(m)]
        rest = [m for m in members if not is_null(m)]
        nullable = nullable or bool(nulls)
        consts: list[str] = []
        exprs: list[str] = []
        for i, m in enumerate(rest):
            if is_str_const(m):
                consts.extend(str_consts(m))
                continue
            exprs.append(self.type_of(m, hint + self.variant_name(m, i)))
        if consts:
            exprs.insert(0, f"Literal[{', '.join(py_literal(c) for c in dict.fromkeys(consts))}]")
        exprs = list(dict.fromkeys(exprs))
        if not exprs:
            expr = "None"
        elif len(exprs) == 1:
            expr = exprs[0]
        else:
            expr = f"Union[{', '.join(exprs)}]"
        if nullable and expr != "None":
            return f"Optional[{expr}]"
        return expr

    def variant_name(self, m: Any, i: int) -> str:
        if isinstance(m, dict):
            props = m.get("properties") or {}
            req = m.get("required") or []
            if len(props) == 1 and list(props) == list(req):
                return camel(next(iter(props)))
            # An internally tagged variant: its tag's constant.
            for p in props.values():
                if isinstance(p, dict) and isinstance(p.get("const"), str):
                    return camel(p["const"])
            if isinstance(m.get("title"), str):
                return camel(m["title"])
        return f"Variant{i}"

    # -- classes ---------------------------------------------------------------

    def add_class(self, name: str, s: dict) -> None:
        required = set(s.get("required") or [])
        fields: list[tuple[str, str, str, str | None, str | None]] = []
        taken: set[str] = set()
        for prop, ps in (s.get("properties") or {}).items():
            fname = field_name(prop)
            while fname in taken:
                fname += "_"
            taken.add(fname)
            ann = self.type_of(ps, name + camel(prop))
            default: str | None = None
            desc = ps.get("description") if isinstance(ps, dict) else None
            if prop not in required:
                if isinstance(ps, dict) and "default" in ps:
                    default = self.default_of(ps["default"], ann, self.is_bytes(ps))
                    if ps["default"] is None and not ann.startswith("Optional["):
                        ann = f"Optional[{ann}]"
                else:
                    default = "None"
                    if not ann.startswith("Optional[") and ann not in ("Any", "None"):
                        ann = f"Optional[{ann}]"
            fields.append((fname, prop, ann, default, desc))
        self.classes[name] = (s.get("description"), fields)

    def is_bytes(self, s: Any) -> bool:
        """Whether ``s`` (through ``$ref``s and nullability) is base64 bytes."""
        for _ in range(32):
            if not isinstance(s, dict):
                return False
            if "$ref" in s:
                s = self.schemas.get(s["$ref"].rsplit("/", 1)[-1])
                continue
            members = s.get("anyOf") or s.get("oneOf") or s.get("allOf")
            if members:
                rest = [m for m in members if not is_null(m)]
                if len(rest) != 1:
                    return False
                s = rest[0]
                continue
            t = s.get("type")
            if isinstance(t, list):
                t = next((x for x in t if x != "null"), None)
            return t == "string" and (s.get("format") == "byte" or s.get("contentEncoding") == "base64")
        return False

    def default_of(self, v: Any, ann: str, is_bytes: bool = False) -> str:
        if v is None:
            return "None"
        if is_bytes and isinstance(v, str):
            try:
                return repr(base64.b64decode(v))
            except ValueError:
                return repr(v)
        if isinstance(v, list):
            return "field(default_factory=list)" if not v else f"field(default_factory=lambda: {v!r})"
        if isinstance(v, dict):
            return "field(default_factory=dict)" if not v else f"field(default_factory=lambda: {v!r})"
        return repr(v)

    # -- the document ------------------------------------------------------------

    def run(self) -> None:
        for key in sorted(self.schemas):
            s = self.schemas[key]
            name = self.names[key]
            r = s if isinstance(s, dict) else {}
            is_object = (
                r.get("type") == "object" or (isinstance(r.get("type"), list) and "object" in r["type"] and "null" not in r["type"])
            ) and not any(k in r for k in ("oneOf", "anyOf", "allOf", "$ref"))
            has_props = bool(r.get("properties"))
            closed_empty = is_object and not has_props and r.get("additionalProperties") is False
            if (is_object and has_props) or closed_empty or (has_props and "type" not in r and not any(k in r for k in ("oneOf", "anyOf", "$ref"))):
                self.add_class(name, r)
            else:
                self.aliases[name] = (self.type_of(r, name), r.get("description") if isinstance(r, dict) else None)
        for path, item in sorted((self.doc.get("paths") or {}).items()):
            m = re.fullmatch(r"/v1/rpc/([^/{}]+)", path)
            if not m or not isinstance(item, dict):
                continue
            action = m.group(1)
            op = item.get("post") or {}
            params = "dict[str, Any]"
            body = (((op.get("requestBody") or {}).get("content") or {}).get("application/json") or {}).get("schema")
            if body is not None:
                params = self.type_of(body, camel(action) + "Params")
            result = "Any"
            ok = (op.get("responses") or {}).get("200") or {}
            ok = self.resolve(ok)
            answer = ((ok.get("content") or {}).get("application/json") or {}).get("schema")
            answer = self.resolve(answer)
            if isinstance(answer, dict) and "result" in (answer.get("properties") or {}):
                result = self.type_of(answer["properties"]["result"], camel(action) + "Result")
            self.actions[action] = (params, result)

    def alias_order(self) -> list[str]:
        names = set(self.aliases)
        deps = {
            n: {w for w in re.findall(r"[A-Za-z_]\w*", e) if w in names and w != n}
            for n, (e, _) in self.aliases.items()
        }
        order: list[str] = []
        done: set[str] = set()
        visiting: set[str] = set()

        def visit(n: str) -> None:
            if n in done:
                return
            if n in visiting:
                return  # a cycle: quoted below
            visiting.add(n)
            for d in sorted(deps[n]):
                visit(d)
            visiting.discard(n)
            done.add(n)
            order.append(n)

        for n in sorted(names):
            visit(n)
        return order

    def emit(self, source: str) -> str:
        out: list[str] = []
        out.append(f'"""The protocol\'s types, generated by tools/gen_models.py from {source}.')
        out.append("")
        out.append("Do not edit: run `python3 tools/gen_models.py URL-OR-FILE` again. One")
        out.append("dataclass per object schema of components.schemas (JSON form: see")
        out.append('allox/_model.py), a type alias per other schema."""')
        out.append("")
        out.append("from __future__ import annotations")
        out.append("")
        out.append("from dataclasses import dataclass, field")
        out.append("from typing import Any, Literal, Optional, Union")
        out.append("")
        out.append("from ._model import Model")
        out.append("")
        exported = sorted(set(self.classes) | set(self.aliases))
        out.append("__all__ = [")
        for n in exported:
            out.append(f"    {n!r},")
        out.append("    'ACTIONS',")
        out.append("]")
        for name in sorted(self.classes):
            desc, fields = self.classes[name]
            out.append("")
            out.append("")
            out.append("@dataclass(kw_only=True)")
            out.append(f"class {name}(Model):")
            body: list[str] = []
            if desc:
                body += docstring(desc, "    ")
                if fields and not fields[0][4]:
                    body.append("")
            for fname, prop, ann, default, fdesc in fields:
                if fdesc:
                    body.append("")
                    for line in fdesc.strip().splitlines():
                        body.append(f"    #: {line}".rstrip())
                meta = f'metadata={{"json": {prop!r}}}' if fname != prop else None
                if meta:
                    if default is None:
                        rhs = f" = field({meta})"
                    elif default.startswith("field("):
                        rhs = f" = {default[:-1]}, {meta})"
                    else:
                        rhs = f" = field(default={default}, {meta})"
                else:
                    rhs = "" if default is None else f" = {default}"
                body.append(f"    {fname}: {ann}{rhs}")
            if not body:
                body.append("    pass")
            out.extend(body)
        order = self.alias_order()
        seen: set[str] = set()
        if order:
            out.append("")
        for name in order:
            expr, desc = self.aliases[name]
            # Aliases not yet defined (a cycle) are named as strings.
            expr = quote_names(expr, {a for a in self.aliases if a not in seen and a != name})
            out.append("")
            if desc:
                for line in desc.strip().splitlines():
                    out.append(f"#: {line}".rstrip())
            out.append(f"{name} = {expr}")
            seen.add(name)
        out.append("")
        out.append("")
        out.append("#: action -> (params type, result type), from the document's /v1/rpc/{action} paths.")
        out.append("ACTIONS: dict[str, tuple[Any, Any]] = {")
        for action in sorted(self.actions):
            p, r = self.actions[action]
            out.append(f"    {action!r}: ({p}, {r}),")
        out.append("}")
        out.append("")
        return "\n".join(out)


def load(source: str, token: str | None) -> dict[str, Any]:
    if re.match(r"https?://", source):
        req = urllib.request.Request(source)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (a URL the caller gave)
            return json.load(r)
    return json.loads(Path(source).read_text())


def generate(doc: dict[str, Any], source: str = "an OpenAPI document") -> str:
    g = Generator(doc)
    g.run()
    return g.emit(source)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="the OpenAPI 3.1 document: a file, or a URL such as http://127.0.0.1:8092/v1/openapi.json")
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    ap.add_argument("--token", help="bearer token for a URL")
    ap.add_argument("--token-file", type=Path, help="file holding the bearer token (e.g. /run/allox/gateway.token)")
    ap.add_argument("--name", help="how the header names the source (default: the source as given)")
    args = ap.parse_args(argv)
    token = args.token
    if token is None and args.token_file is not None:
        token = args.token_file.read_text().strip()
    doc = load(args.source, token)
    if not isinstance(doc, dict) or "components" not in doc:
        print(f"gen_models: {args.source} has no components; not an OpenAPI document?", file=sys.stderr)
        return 1
    text = generate(doc, args.name or args.source)
    compile(text, str(args.output), "exec")
    args.output.write_text(text)
    print(f"gen_models: wrote {args.output} ({text.count('@dataclass')} classes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
