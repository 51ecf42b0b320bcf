//! `agenthost-api`: the agenthost HTTP API as its clients see it.
//!
//! **Owns**: the JSON wire types ([`wire`]), the OpenAPI document the server serves
//! ([`OPENAPI`], a golden copy the server's tests compare with what it generates) and a typed
//! async client of every route ([`Client`]) whose event stream ([`Events`]) reconnects with
//! `Last-Event-ID` and never yields a durable event twice or skips one.
//!
//! **Must not**: depend on the server or the runtime. With the `domain` feature it knows the
//! domain types ([`agenthost_model`]) to convert from them; without it, nothing of agenthost
//! but the shared HTTP pieces.
//!
//! ```no_run
//! # async fn run() -> Result<(), agenthost_api::Error> {
//! use agenthost_api::{Client, Frame, wire};
//!
//! let client = Client::new("http://127.0.0.1:4096")?;
//! let session = client.create_session(&wire::CreateSession::default()).await?;
//! let mut events = client.events(&session.id, None);
//! let prompt = wire::Prompt { text: "What is 2 + 2?".into(), ..Default::default() };
//! client.prompt(&session.id, &prompt).await?;
//! while let Some(frame) = events.next().await {
//!     match frame? {
//!         Frame::Delta(delta) => print!("{}", delta.delta),
//!         Frame::Status(status) if status.kind == wire::StatusType::Idle => break,
//!         _ => {}
//!     }
//! }
//! # Ok(()) }
//! ```

mod client;
#[cfg(feature = "domain")]
mod domain;
mod events;
pub mod wire;

pub use client::{Client, Error};
pub use events::{Events, Frame, Reconnect};

/// The OpenAPI 3.1 document of the API, as `GET /openapi.json` serves it. The server generates
/// it from its handlers; a test of the server fails when the two differ.
pub const OPENAPI: &str = include_str!("../openapi.json");
