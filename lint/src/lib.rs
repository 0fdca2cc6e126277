//! idem-lint: the 幂等性说明 gate for OpenAPI specs (user documentation: `lint/README.md`).
//!
//! Pipeline: [`loader`] reads a spec (JSON via [`json`], YAML via [`yaml`]) into a positioned
//! [`node`] tree and checks every `$ref`; [`model`] lists the operations with merged
//! parameters; [`statement`] reads each operation's 幂等性说明 ([`section`]) and
//! `x-idempotency`; [`rules`] produce findings; [`lint`] applies suppressions and positions;
//! [`report`] renders them.

pub mod config;
pub mod crosscheck;
pub mod fix;
pub mod generate;
pub mod json;
pub mod lint;
pub mod loader;
pub mod model;
pub mod node;
pub mod policy;
pub mod report;
pub mod rules;
pub mod section;
pub mod security;
pub mod source;
pub mod statement;
pub mod value;
pub mod yaml;
