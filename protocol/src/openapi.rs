//! The OpenAPI 3.1 document of the HTTP gateway, made from the protocol's
//! own types: each action's params and answers are the JSON Schemas
//! (2020-12) that `schemars` derives from the same structs serde encodes,
//! so the document cannot drift from what the daemon takes and gives.
//!
//! Paths: `POST /v1/rpc/{action}` for each action (its params as the
//! body, `{"result": ...}` as the answer, and as `application/x-ndjson`
//! the stream of `{"event": ...}` lines that ends with the answer),
//! `POST /v1/rpc` (`{"action", "params"}`), `GET` and `PUT` of
//! `/v1/files/{agent}/{session}/{path}`, and `GET /v1/openapi.json`.

use crate::message::{Action, Event, Request, Response};
use crate::ErrorCode;
use schemars::generate::SchemaSettings;
use schemars::SchemaGenerator;
use serde_json::{json, Map, Value};

/// Where the schemas live in the document.
const SCHEMAS: &str = "/components/schemas";

fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = SCHEMAS.into())
        .into_generator()
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

/// The schema of an action's `result`: its one answer, or any of them.
fn result_schema(a: &Action, schemas: &mut SchemaGenerator) -> Value {
    let mut each: Vec<Value> = a
        .answers
        .iter()
        .map(|k| {
            Response::schema_of(k, schemas)
                .unwrap_or_else(|| panic!("{}: no Response variant {k}", a.name))
                .to_value()
        })
        .collect();
    match each.len() {
        1 => each.remove(0),
        _ => json!({ "oneOf": each }),
    }
}

fn answer_schema(result: Value) -> Value {
    json!({
        "type": "object",
        "properties": { "result": result },
        "required": ["result"],
        "additionalProperties": false,
    })
}

/// The whole document.
pub fn document() -> Value {
    let mut schemas = generator();
    let actions = Request::api(&mut schemas);
    let event = schemas.subschema_for::<Event>().to_value();
    let error_ref = json!({ "$ref": "#/components/schemas/ErrorAnswer" });
    let mut paths = Map::new();
    let mut envelopes = Vec::new();
    for a in &actions {
        let params = a.params.clone().to_value();
        let result = (!a.answers.is_empty()).then(|| result_schema(a, &mut schemas));
        let line = match &result {
            Some(r) => json!({ "oneOf": [
                { "$ref": "#/components/schemas/EventLine" },
                answer_schema(r.clone()),
                error_ref,
            ]}),
            None => json!({ "oneOf": [
                { "$ref": "#/components/schemas/EventLine" },
                error_ref,
            ]}),
        };
        let mut ok = json!({
            "description": match result {
                Some(_) => "The answer; with `Accept: application/x-ndjson`, the request's events, one a line, then the answer",
                None => "Only as a stream (`Accept: application/x-ndjson`): events until the client goes, or an error",
            },
            "content": { "application/x-ndjson": { "schema": line } },
        });
        if let Some(r) = &result {
            ok["content"]["application/json"] = json!({ "schema": answer_schema(r.clone()) });
        }
        paths.insert(
            format!("/v1/rpc/{}", a.name),
            json!({ "post": {
                "operationId": a.name,
                "summary": a.name,
                "x-allox-audited": a.mutating,
                "x-allox-answers": a.answers,
                "requestBody": { "required": false, "content": json_content(params.clone()) },
                "responses": {
                    "200": ok,
                    "default": { "$ref": "#/components/responses/Error" },
                },
            }}),
        );
        envelopes.push(json!({
            "type": "object",
            "properties": { "action": { "const": a.name }, "params": params },
            "required": ["action"],
            "additionalProperties": false,
        }));
    }
    paths.insert(
        "/v1/rpc".into(),
        json!({ "post": {
            "operationId": "rpc",
            "summary": "Any action in the seed's JSON form",
            "requestBody": { "required": true, "content": json_content(json!({ "oneOf": envelopes })) },
            "responses": {
                "200": {
                    "description": "The answer (or, as NDJSON, the stream), as on the action's own path",
                    "content": json_content(json!({
                        "type": "object",
                        "properties": { "result": {} },
                        "required": ["result"],
                    })),
                },
                "default": { "$ref": "#/components/responses/Error" },
            },
        }}),
    );
    let file_params = json!([
        { "name": "agent", "in": "path", "required": true, "schema": { "type": "string" } },
        { "name": "session", "in": "path", "required": true, "schema": { "type": "string" } },
        { "name": "path", "in": "path", "required": true, "schema": { "type": "string" },
          "description": "The file's path below the scope, percent-encoded" },
        { "name": "scope", "in": "query", "schema": { "enum": ["session", "shared"] } },
    ]);
    paths.insert(
        "/v1/files/{agent}/{session}/{path}".into(),
        json!({
            "parameters": file_params,
            "get": {
                "operationId": "files.get",
                "summary": "A file's bytes",
                "parameters": [{ "name": "checkpoint", "in": "query", "schema": { "type": "string" } }],
                "responses": {
                    "200": { "description": "The file", "content": { "application/octet-stream": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } } } },
                    "default": { "$ref": "#/components/responses/Error" },
                },
            },
            "put": {
                "operationId": "files.put",
                "summary": "Writes a file whole: committed only if the whole body came",
                "requestBody": { "required": true, "content": { "*/*": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } } } },
                "responses": {
                    "200": { "description": "Written", "content": json_content(json!({
                        "type": "object",
                        "properties": { "path": { "type": "string" }, "size": { "type": "integer", "minimum": 0 } },
                        "required": ["path", "size"],
                    })) },
                    "default": { "$ref": "#/components/responses/Error" },
                },
            },
        }),
    );
    paths.insert(
        "/v1/openapi.json".into(),
        json!({ "get": {
            "operationId": "openapi",
            "summary": "This document",
            "security": [],
            "responses": { "200": { "description": "The OpenAPI document", "content": json_content(json!({ "type": "object" })) } },
        }}),
    );
    let mut defs = schemas.take_definitions(true);
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    defs.insert(
        "ErrorAnswer".into(),
        json!({
            "type": "object",
            "properties": { "error": {
                "type": "object",
                "properties": {
                    "code": { "enum": codes },
                    "message": { "type": "string" },
                },
                "required": ["code", "message"],
                "additionalProperties": false,
            }},
            "required": ["error"],
            "additionalProperties": false,
        }),
    );
    defs.insert(
        "EventLine".into(),
        json!({
            "type": "object",
            "properties": { "event": event },
            "required": ["event"],
            "additionalProperties": false,
        }),
    );
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "Allox OS gateway",
            "description": "The control protocol's JSON form over HTTP: `alloxctl gateway`. Every request needs `Authorization: Bearer <token>` (the token file beside the daemon's socket) and a `Host` naming the gateway.",
            "version": format!("{}.{}", crate::PROTOCOL_VERSION, env!("CARGO_PKG_VERSION")),
        },
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "responses": { "Error": {
                "description": "An error: 400 invalid_request (413 too large, 415 not JSON), 401/403 unauthorized, 404 not_found, 409 conflict, 501 unsupported, 503/504 unavailable, 500 internal",
                "content": json_content(error_ref),
            }},
            "schemas": defs,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_has_a_path_and_every_answer_a_schema() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        for name in Request::ACTIONS {
            let op = &paths[&format!("/v1/rpc/{name}")]["post"];
            assert_eq!(op["operationId"], *name);
            assert!(
                op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("#/components/schemas/"))
            );
        }
        // Every $ref resolves.
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"").skip(1) {
            let r = &r[..r.find('"').unwrap()];
            let name = r
                .strip_prefix("#/components/schemas/")
                .or_else(|| r.strip_prefix("#/components/responses/"))
                .unwrap_or_else(|| panic!("a $ref outside the components: {r}"));
            assert!(
                schemas.contains_key(name) || name == "Error",
                "{r} resolves to nothing"
            );
        }
        // Every response variant is some action's answer.
        let api = Request::api(&mut generator());
        for kind in Response::KINDS {
            assert!(
                api.iter().any(|a| a.answers.contains(kind)),
                "{kind} answers no action"
            );
        }
    }

    #[test]
    fn params_are_closed_where_the_structs_refuse_unknown_fields() {
        let doc = document();
        let s = &doc["components"]["schemas"]["AgentCreate"];
        assert_eq!(s["additionalProperties"], false, "{s}");
        assert_eq!(s["required"], json!(["agent_id"]), "{s}");
        let bytes = &doc["components"]["schemas"]["Bytes"];
        assert_eq!(bytes["contentEncoding"], "base64");
    }
}
