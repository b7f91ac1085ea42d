//! `GET /v1/openapi.json`: the API's description.

use super::http::{full, HttpResponse};

/// The OpenAPI document served.
pub fn openapi() -> HttpResponse {
    let doc = allox_protocol::openapi::document();
    hyper::Response::builder()
        .status(200)
        .header("Content-Type", "application/json")
        .body(full(doc.to_string()))
        .expect("a constant status and header")
}
