//! The judge: the invariants, each defined once ([`invariants`]: ghost, lost, duplicate, order,
//! liveness), what happened, counted from the database after the run ([`counts`]), latency
//! summaries ([`latency`]), plans read with EXPLAIN ([`explain`]), the scenarios' expected
//! figures held against what was measured ([`expectations`]), and judging a consumer whose
//! tables live in another database ([`two_databases`]).

pub mod counts;
pub mod expectations;
pub mod explain;
pub mod invariants;
pub mod latency;
pub mod two_databases;
