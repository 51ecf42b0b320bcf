//! Shared helpers for the integration-test binary in `tests/it/`.
