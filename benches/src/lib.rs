//! Benchmarks live in `benches/`; this library only hosts shared bench fixtures.
