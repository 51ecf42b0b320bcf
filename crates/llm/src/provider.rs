//! The [`Provider`] trait every model backend implements.

use std::fmt;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::error::Error;
use crate::event::{Event, Response, collect};
use crate::request::Request;

/// A provider's event stream; see [`crate::event`] for the contract its items follow.
pub type EventStream = BoxStream<'static, Result<Event, Error>>;

/// A model backend. Object-safe: the runtime holds an `Arc<dyn Provider>`.
///
/// **Invariant:** one call is at most one provider request, issued when the stream is first
/// polled. Implementations never retry; retries belong to the runtime.
pub trait Provider: Send + Sync + fmt::Debug {
    /// Starts one model call. Nothing is sent until the stream is polled; dropping the stream
    /// cancels the call.
    fn stream(&self, request: Request) -> EventStream;

    /// [`Provider::stream`] of a request the caller keeps, to send it again on a retry.
    /// Providers that only read the request override this to spare a copy of it: the HTTP ones
    /// serialize their body from it at once, so a long history is not copied once per call.
    fn stream_ref(&self, request: &Request) -> EventStream {
        self.stream(request.clone())
    }

    /// Runs one call to completion and collects it. Single attempt, like [`Provider::stream`].
    fn generate(&self, request: Request) -> BoxFuture<'static, Result<Response, Error>> {
        collect(self.stream(request)).boxed()
    }
}
