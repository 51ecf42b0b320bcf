//! `GET /console`: the operator console, a page of plain ES modules, HTML and CSS embedded in
//! the binary at build time (no build step, no CDN). It is one more client of the public HTTP
//! API and event stream; it holds no secret and needs no token to load (it asks for the API's
//! token, if any, and keeps it for the tab). Served with an `ETag` and `Cache-Control:
//! no-cache`, so a browser revalidates and gets `304` while the binary is the same.
//!
//! `AGENTHOST_CONSOLE_DIR` serves the files from that directory instead, read at each request:
//! for working on the console without rebuilding the binary.

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The console's files: name, content type, contents.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../console/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../console/style.css"),
    ),
];

/// `GET /console`.
pub(crate) async fn index(headers: HeaderMap) -> Response {
    file("index.html", &headers)
}

/// `GET /console/{file}`.
pub(crate) async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    file(&name, &headers)
}

fn file(name: &str, headers: &HeaderMap) -> Response {
    let Some((name, kind, embedded)) = FILES.iter().find(|(n, ..)| *n == name).copied() else {
        return crate::error::ApiError::new(
            crate::error::ErrorType::NotFound,
            format!("the console has no file {name:?}"),
        )
        .into_response();
    };
    let body = match std::env::var_os("AGENTHOST_CONSOLE_DIR") {
        Some(dir) => match std::fs::read_to_string(std::path::Path::new(&dir).join(name)) {
            Ok(text) => text,
            Err(_) => embedded.to_owned(),
        },
        None => embedded.to_owned(),
    };
    let etag = format!("\"{:016x}\"", fnv(body.as_bytes()));
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    let mut response = match fresh {
        true => StatusCode::NOT_MODIFIED.into_response(),
        false => ([(header::CONTENT_TYPE, kind)], body).into_response(),
    };
    let headers = response.headers_mut();
    if let Ok(etag) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// FNV-1a, 64 bits: an ETag only has to change when the bytes do.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
