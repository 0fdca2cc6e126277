//! Gateway policy files, read with the filter's own parser (`idem_filter::policy::parse_bundle`:
//! one source of truth, the same errors) plus the TOML spans of the fields the cross-check
//! rules point at, and the merge behind `idem-lint bundle`.
//!
//! A policy *set* is every `*.toml` file of the directories given (sorted by name, not
//! recursive) and every file given by name, in command-line order. Each file must be a valid
//! bundle on its own; the set is one bundle: routes concatenated, a `[shared]` or `[redis]`
//! table in at most one file, route names unique and no two routes matching the same requests.
//!
//! - `file.rs`: one policy file, parsed, with the spans of its fields;
//! - `set.rs`: the files of a set, loaded and checked across files, and their routes;
//! - `bundle.rs`: the set merged into one table, written as TOML or JSON;
//! - `envoy.rs`: the Envoy `http_filters` entry that carries a bundle, and a whole bootstrap;
//! - `keys.rs`: a spec's key as the filter's sources (what the generator writes, IDEM103 compares).

mod bundle;
mod envoy;
mod file;
pub mod keys;
mod set;

pub use self::envoy::{bootstrap, envoy_filter, Bootstrap, Filter};
pub use self::file::{fatal, PolicyFile, RouteSpans};
pub use self::set::{expand, shape, PolicySet, RouteRef};
