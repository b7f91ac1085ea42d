"""The gateway's OpenAPI document: served without a token, the same as the
checked-in ``openapi.json`` (from which ``allox/models.py`` is generated),
and valid by a standard validator (``openapi-spec-validator``). And the
conftest's answer check (``OpenAPICheck``) catching what does not fit.

Needs ``pip install openapi-spec-validator`` (it brings ``jsonschema``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

import allox

HERE = Path(__file__).resolve().parent
CHECKED_IN = HERE.parent / "openapi.json"


def _validator():
    try:
        import openapi_spec_validator
    except ImportError:
        pytest.fail(
            "openapi-spec-validator is not installed: /var/tmp/allox-venv/bin/pip install openapi-spec-validator",
            pytrace=False,
        )
    return openapi_spec_validator


@pytest.mark.gateway
@pytest.mark.gateway_openapi
def test_the_served_document_is_the_checked_in_one_and_valid(gateway):
    r = httpx.get(f"{gateway.base_url}/v1/openapi.json")  # no token: the document is public
    assert r.status_code == 200, f"GET /v1/openapi.json without a token: HTTP {r.status_code} {r.text[:300]}"
    assert r.headers["Content-Type"].split(";")[0] == "application/json", r.headers
    served = r.json()
    checked_in = json.loads(CHECKED_IN.read_text())
    if served != checked_in:
        changed = sorted(
            f"{part}: {k}"
            for part in ("paths", "components")
            for k in set(served.get(part, {})) ^ set(checked_in.get(part, {}))
            | {k for k in set(served.get(part, {})) & set(checked_in.get(part, {})) if served[part][k] != checked_in[part][k]}
        )
        pytest.fail(
            f"the gateway serves another document than {CHECKED_IN} (regenerate it and allox/models.py: "
            f"tools/gen_models.py); differing: {changed[:20] or [k for k in served if served.get(k) != checked_in.get(k)]}",
            pytrace=False,
        )
    validator = _validator()
    validator.validate(served)  # raises OpenAPIValidationError naming the path and why
    # Every schema is a Draft 2020-12 schema (the document's jsonSchemaDialect).
    from jsonschema import Draft202012Validator

    assert served["jsonSchemaDialect"] == "https://json-schema.org/draft/2020-12/schema"
    for name, schema in served["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)


def test_the_models_are_generated_from_the_checked_in_document():
    spec = importlib.util.spec_from_file_location("gen_models", HERE.parent / "tools" / "gen_models.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.generate(json.loads(CHECKED_IN.read_text()), "openapi.json")
    assert text == (HERE.parent / "allox" / "models.py").read_text(), (
        "allox/models.py is not what tools/gen_models.py makes of openapi.json: run "
        "python3 tools/gen_models.py openapi.json"
    )


def test_the_answer_check_catches_what_does_not_fit(openapi_check):
    """A fake gateway, watched as the fixtures' gateways are, answering
    wrongly: each answer fails naming the action, where and why."""
    answers = {
        "checkpoint.list": (200, "application/json", b'{"result": {"checkpoints": "none", "head": null}}'),
        "agent.create": (409, "application/json", b'{"error": {"code": "clash", "message": "exists"}}'),
        "session.list": (200, "application/x-ndjson", b'{"event": {"progress": {"message": "x"}}}\n{"result": {"sessions": []}}\n'),
        "system.ping": (200, "application/json", b'{"result": {"version": 2, "build": "b"}}'),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        action = json.loads(request.content)["action"]
        status, ctype, body = answers[action]
        # A body as an iterator is streamed (bytes would be read at once).
        return httpx.Response(status, headers={"Content-Type": ctype}, content=iter([body]))

    url = "http://openapi-check.test:1"
    counts = {k: getattr(openapi_check, k).copy() for k in ("answers", "results", "errors", "lines")}
    openapi_check.watch(url)
    try:
        with allox.Client(url, token="t", transport=httpx.MockTransport(handler)) as c:
            assert c.ping().version == 2  # fits
            with pytest.raises(AssertionError, match=r"(?s)checkpoint\.list: the HTTP 200 answer .* at /result/checkpoints: 'none' is not of type 'array'"):
                c.checkpoint_list("a", "s")
            with pytest.raises(AssertionError, match=r"(?s)agent\.create: the HTTP 409 answer .* at /error/code: 'clash' is not one of"):
                c.agent_create("a")
            s = c.stream("session.list", agent_id="a")
            with pytest.raises(AssertionError, match=r"(?s)session\.list: line 2 of the stream .*'agent_id' is a required property"):
                list(s)
    finally:
        openapi_check.origins.discard(("openapi-check.test", 1))
        failures = openapi_check.take_failures()  # this test's own: not to fail it
        for k, v in counts.items():  # nor to count as the gateway's
            setattr(openapi_check, k, v)
    assert len(failures) == 3, failures
