//! `GET /v1/openapi.json`: the API's description.

use crate::body::{full, HttpResponse};

/// The OpenAPI document served.
pub fn openapi() -> HttpResponse {
    let doc = allox_protocol::openapi::document();
    hyper::Response::builder()
        .status(200)
        .header("Content-Type", "application/json")
        .body(full(doc.to_string()))
        .expect("a constant status and header")
}

#[cfg(test)]
mod tests {
    /// The Python client's models are generated from a copy of the
    /// document kept beside them; the copy must be today's.
    #[test]
    fn the_python_client_s_copy_of_the_document_is_today_s() {
        let kept: serde_json::Value =
            serde_json::from_str(include_str!("../../clients/python/openapi.json"))
                .expect("clients/python/openapi.json is JSON");
        assert!(
            kept == allox_protocol::openapi::document(),
            "clients/python/openapi.json is not the document the gateway serves: run \
             `alloxctl openapi > clients/python/openapi.json` and \
             `python3 clients/python/tools/gen_models.py clients/python/openapi.json --name openapi.json`"
        );
    }
}
