//! The integration-test binary: cross-crate behaviour of the runtime over a real store, driven by
//! the scripted provider.

mod agent_loop;
mod approvals;
mod budgets;
mod compaction;
mod console;
mod crash_matrix;
mod generate;
mod harness;
mod interop;
mod laws;
mod mcp;
mod model;
mod postgres;
mod recovery;
mod schedules;
mod supervision;
