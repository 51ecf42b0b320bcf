//! Where the binary's logs and traces go: logs to stderr (text or JSON lines, filtered by
//! `RUST_LOG`, default `info`) and, with `[telemetry] otlp_endpoint` and the `otlp` feature,
//! every span (drains, steps, provider and tool calls, requests) to an OpenTelemetry collector
//! over OTLP/HTTP (protobuf), batched on a thread of its own.

use tracing_subscriber::filter::{Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// `[telemetry]`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Telemetry {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); traces go to
    /// `<endpoint>/v1/traces`.
    pub otlp_endpoint: String,
    /// The `service.name` of the exported spans.
    pub service_name: String,
}

/// Keeps the trace export running; dropping it flushes what is batched (bounded by the
/// exporter's timeout).
#[must_use = "dropping the guard stops the trace export"]
pub struct Guard {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("telemetry::Guard")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // On a thread of its own: the exporter's blocking client must not be dropped on an
        // async runtime's thread.
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider.take() {
            let flushed = std::thread::spawn(move || provider.shutdown()).join();
            if let Ok(Err(e)) = flushed {
                eprintln!("agenthost: the trace export did not flush: {e}");
            }
        }
    }
}

/// The registry under one filter: the logs and the trace export keep the same spans and events
/// (both follow `RUST_LOG`), so one global filter serves both. A filter per layer would cost a
/// lookup of the span on every enter and exit of every instrumented future.
type Filter = Box<dyn Layer<Registry> + Send + Sync>;
type Filtered = tracing_subscriber::layer::Layered<Filter, Registry>;
type Boxed = Box<dyn Layer<Filtered> + Send + Sync>;

/// `RUST_LOG`, `info` when unset or invalid. Targets and levels alone (`info`,
/// `agenthost=debug,hyper=warn`) make a static filter ([`Targets`]), which does nothing when a
/// span is entered or left; a directive on spans or fields (`[drain]=debug`) needs [`EnvFilter`],
/// which looks up every span entered and left. `exporting`: traces go to a collector.
fn filter(exporting: bool) -> Filter {
    filter_of(&std::env::var("RUST_LOG").unwrap_or_default(), exporting)
}

/// The target of the runtime's spans (drain, step, provider and tool calls).
const RUNTIME: &str = "agenthost_actors";

fn filter_of(directives: &str, exporting: bool) -> Filter {
    let directives = match directives.trim() {
        "" => "info",
        set => set,
    };
    // `Targets` would read `[drain]` as a target's name.
    let on_spans = directives.contains(['[', '{']);
    match directives.parse::<Targets>() {
        Ok(targets) if !on_spans => match runtime_spans(&targets, exporting) {
            true => targets.boxed(),
            false => targets
                .and_then(filter_fn(|meta| {
                    !(meta.is_span() && meta.target().starts_with(RUNTIME))
                }))
                .boxed(),
        },
        _ => EnvFilter::try_new(directives)
            .unwrap_or_else(|_| EnvFilter::new("info"))
            .boxed(),
    }
}

/// Whether the runtime's spans are recorded: when traces are exported, or the runtime logs at
/// debug (its debug events then sit in their drain, step and call); a directive on spans keeps
/// them too (`filter_of`). Otherwise their only reader would be a log line's prefix, and the
/// runtime's log events carry their own `session_id` (and `step` and `attempt` where they have
/// them), while the three spans of a turn cost 4–5 % of the server's CPU (BENCHMARKS.md).
fn runtime_spans(targets: &Targets, exporting: bool) -> bool {
    exporting || targets.would_enable(RUNTIME, &tracing::Level::DEBUG)
}

/// Installs the process's subscriber: call once, from the binary only.
pub fn init(json: bool, telemetry: Option<&Telemetry>) -> Result<Guard, String> {
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt: Boxed = match json {
        true => fmt.json().boxed(),
        false => fmt.boxed(),
    };
    #[cfg_attr(not(feature = "otlp"), allow(unused_mut))]
    let mut layers = vec![fmt];
    #[cfg_attr(not(feature = "otlp"), allow(unused_mut))]
    let mut guard = Guard {
        #[cfg(feature = "otlp")]
        provider: None,
    };
    if let Some(telemetry) = telemetry {
        #[cfg(feature = "otlp")]
        {
            // Built on a thread of its own: the exporter's blocking client starts (and would
            // drop) a runtime, which an async runtime's thread must not do.
            let telemetry = telemetry.clone();
            let (layer, provider) = std::thread::spawn(move || otlp::layer(&telemetry))
                .join()
                .map_err(|_| "building the OTLP exporter panicked".to_owned())??;
            layers.push(layer);
            guard.provider = Some(provider);
        }
        #[cfg(not(feature = "otlp"))]
        return Err(format!(
            "[telemetry] otlp_endpoint = {:?} needs an agenthost built with the otlp feature",
            telemetry.otlp_endpoint
        ));
    }
    tracing_subscriber::registry()
        .with(filter(telemetry.is_some()))
        .with(layers)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))?;
    Ok(guard)
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer as _;

    use super::{Boxed, Telemetry};

    /// The OpenTelemetry layer and the provider that batches and exports its spans.
    pub(super) fn layer(telemetry: &Telemetry) -> Result<(Boxed, SdkTracerProvider), String> {
        // The exporter's own client, with our TLS (see agenthost_http): nothing process-wide.
        let client = agenthost_http::blocking_client_builder()?
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the OTLP client: {e}"))?;
        let endpoint = format!(
            "{}/v1/traces",
            telemetry.otlp_endpoint.trim_end_matches('/')
        );
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| format!("[telemetry] otlp_endpoint: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(telemetry.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("agenthost");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer).boxed();
        Ok((layer, provider))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// Counts the events that reach it.
    struct Count(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Count {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many of a fixed set of events pass `directives`: info and debug events in this
    /// crate's target, and a debug event inside a span named `drain`.
    fn passed(directives: &str) -> usize {
        let count = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry()
            .with(filter_of(directives, false))
            .with(Count(count.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("info");
            tracing::debug!("debug");
            tracing::info_span!("drain").in_scope(|| tracing::debug!("in a drain"));
        });
        count.load(Ordering::SeqCst)
    }

    #[test]
    fn rust_log_filters_by_target_and_level_and_by_span_when_asked() {
        // Unset or invalid: info.
        assert_eq!(passed(""), 1);
        assert_eq!(passed("not a level=="), 1);
        assert_eq!(passed("warn"), 0);
        assert_eq!(passed("info"), 1);
        assert_eq!(passed("info,agenthost=debug"), 3);
        // A span directive: the debug event inside `drain` passes, the one outside does not.
        assert_eq!(passed("info,[drain]=debug"), 2);
    }

    /// Counts the spans that reach it.
    struct Spans(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Spans {
        fn on_new_span(
            &self,
            _: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Which of a runtime span, a runtime event and another crate's span pass `directives`.
    fn recorded(directives: &str, exporting: bool) -> (bool, bool, bool) {
        let (spans, events) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let subscriber = tracing_subscriber::registry()
            .with(filter_of(directives, exporting))
            .with(Spans(spans.clone()))
            .with(Count(events.clone()));
        let count = |spans: &AtomicUsize| spans.load(Ordering::SeqCst);
        let mut seen = (false, false, false);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!(target: "agenthost_actors::drain", "drain").in_scope(|| {
                tracing::warn!(target: "agenthost_actors::drain", "in a drain");
            });
            seen.0 = count(&spans) == 1;
            seen.1 = events.load(Ordering::SeqCst) == 1;
            let _ = tracing::info_span!(target: "agenthost_server", "request");
            seen.2 = count(&spans) == usize::from(seen.0) + 1;
        });
        seen
    }

    #[test]
    fn the_runtimes_spans_are_recorded_only_for_a_reader_beyond_a_log_prefix() {
        // Logs alone at info: the runtime's events, not its spans; other spans stay.
        assert_eq!(recorded("", false), (false, true, true));
        assert_eq!(recorded("info", false), (false, true, true));
        // Exported, or the runtime logging at debug, or a directive on spans: recorded.
        assert_eq!(recorded("", true), (true, true, true));
        assert_eq!(
            recorded("info,agenthost_actors=debug", false),
            (true, true, true)
        );
        assert_eq!(recorded("debug", false), (true, true, true));
        assert_eq!(recorded("info,[drain]=debug", false), (true, true, true));
    }
}
