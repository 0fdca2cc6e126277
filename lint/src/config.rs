//! `idem-lint.toml`: severities per rule, which methods count, extra section-title aliases.
//!
//! ```toml
//! methods = ["post", "put", "patch", "delete"]   # the default
//! section-titles = ["幂等设计"]                   # extra titles besides 幂等性说明 / Idempotency
//! fail-on = "error"                              # default for --fail-on
//!
//! [rules]
//! IDEM008 = "error"    # error | warning | off
//! IDEM002 = "off"
//! ```
//! Unknown keys, unknown rule codes and unknown severities are errors (exit 2) with the file,
//! line and column.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::rules;
use crate::source::FatalError;

/// Defined with the rules (each has a default severity); the config overrides it per rule.
pub use crate::rules::Severity;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleLevel {
    Error,
    Warning,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FailOn {
    #[default]
    Error,
    Warning,
    Never,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    methods: Option<Vec<String>>,
    section_titles: Option<Vec<String>>,
    fail_on: Option<FailOn>,
    #[serde(default)]
    rules: BTreeMap<String, RuleLevel>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Lower-case HTTP methods that must carry a statement.
    pub methods: Vec<String>,
    pub section_titles: Vec<String>,
    pub fail_on: Option<FailOn>,
    pub levels: BTreeMap<String, RuleLevel>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            methods: ["post", "put", "patch", "delete"].iter().map(|s| s.to_string()).collect(),
            section_titles: Vec::new(),
            fail_on: None,
            levels: BTreeMap::new(),
        }
    }
}

impl Config {
    pub fn parse(name: &str, text: &str) -> Result<Config, FatalError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let off = e.span().map_or(0, |s| s.start);
            FatalError::at(name, text, off, format!("invalid config: {}", e.message()))
        })?;
        let mut cfg = Config::default();
        if let Some(m) = raw.methods {
            let mut out = Vec::new();
            for x in m {
                let l = x.to_ascii_lowercase();
                if !crate::model::METHODS.contains(&l.as_str()) {
                    return Err(FatalError::at(
                        name,
                        text,
                        text.find(&x).unwrap_or(0),
                        format!("invalid config: unknown HTTP method \"{x}\""),
                    ));
                }
                out.push(l);
            }
            cfg.methods = out;
        }
        cfg.section_titles = raw.section_titles.unwrap_or_default();
        cfg.fail_on = raw.fail_on;
        for (code, level) in raw.rules {
            if rules::find(&code).is_none() {
                return Err(FatalError::at(
                    name,
                    text,
                    text.find(&code).unwrap_or(0),
                    format!("invalid config: unknown rule \"{code}\" (see `idem-lint rules`)"),
                ));
            }
            cfg.levels.insert(code, level);
        }
        Ok(cfg)
    }

    /// Effective severity of a rule, `None` when it is off.
    pub fn severity(&self, code: &str) -> Option<Severity> {
        let default = rules::find(code).map_or(Severity::Error, |r| r.severity);
        match self.levels.get(code) {
            None => Some(default),
            Some(RuleLevel::Error) => Some(Severity::Error),
            Some(RuleLevel::Warning) => Some(Severity::Warning),
            Some(RuleLevel::Off) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let c = Config::parse(
            "c.toml",
            "methods = [\"POST\"]\nsection-titles = [\"幂等设计\"]\n[rules]\nIDEM008 = \"error\"\nIDEM002 = \"off\"\n",
        )
        .unwrap();
        assert_eq!(c.methods, vec!["post"]);
        assert_eq!(c.severity(crate::rules::idem008_unstable_key::RULE.code), Some(Severity::Error));
        assert_eq!(c.severity(crate::rules::idem002_idempotent_unstated::RULE.code), None);
        assert_eq!(c.severity(crate::rules::idem001_missing_statement::RULE.code), Some(Severity::Error));

        let e = Config::parse("c.toml", "\n\nmethod = [\"post\"]\n").unwrap_err();
        assert_eq!(e.position.unwrap().line, 3, "{e}");
        let e = Config::parse("c.toml", "[rules]\nIDEM999 = \"off\"\n").unwrap_err();
        assert!(e.reason.contains("unknown rule"), "{e}");
        assert!(Config::parse("c.toml", "[rules]\nIDEM001 = \"loud\"\n").is_err());
        assert!(Config::parse("c.toml", "methods = [\"fetch\"]\n").is_err());
    }
}
