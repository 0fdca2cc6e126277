//! Prints the JSON Schema of a policy bundle, generated from the types the filter parses:
//!
//!     cargo run -q -p idem-filter --features schema --example bundle-schema > policies/bundle.schema.json
//!
//! `filter/tests/schema.rs` fails when the committed file differs from this output.

fn main() {
    match serde_json::to_string_pretty(&idem_filter::policy::bundle_schema()) {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("bundle-schema: {e}");
            std::process::exit(1);
        }
    }
}
