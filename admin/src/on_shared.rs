//! The operator's three operations on the shared store: calls to the filter's admin listener
//! (`role = "admin"`, filter/src/lifecycle/admin.rs), which makes the fenced change inside
//! Envoy, where the records live.

use crate::http::{self, Target};
use crate::{Outcome, Row};
use idem_filter::response::StoredResponse;
use serde_json::{json, Value};

pub struct Listener {
    pub target: Target,
    pub secret: String,
}

impl Listener {
    pub fn list(&self) -> Result<Vec<Row>, String> {
        let rows = self.call("GET", "/unknown", None)?.1;
        let Value::Array(rows) = rows else {
            return Err(format!("the admin listener answered {rows}, not a list"));
        };
        let text = |r: &Value, f: &str| r.get(f).and_then(Value::as_str).unwrap_or_default().to_string();
        Ok(rows
            .iter()
            .map(|r| Row {
                store_key: text(r, "store_key"),
                owner: text(r, "owner"),
                first_seen_at: text(r, "first_seen_at"),
                held_until: text(r, "held_until"),
                looking_up: r.get("looking_up").and_then(Value::as_bool).unwrap_or(false),
                route: r.get("route").and_then(Value::as_str).map(str::to_string),
                key_prefix: r.get("key_prefix").and_then(Value::as_str).map(str::to_string),
            })
            .collect())
    }

    /// What the store holds for a scoped id (`GET /keys/<id>`).
    pub fn show(&self, id_hex: &str) -> Result<Value, String> {
        Ok(self.call("GET", &format!("/keys/{id_hex}"), None)?.1)
    }

    pub fn release(&self, store_key: &str, owner: Option<&str>) -> Result<Outcome, String> {
        self.change(store_key, "release", owner, None)
    }

    pub fn resolve(&self, store_key: &str, owner: Option<&str>, answer: &StoredResponse) -> Result<Outcome, String> {
        let headers: Vec<Value> = answer.headers.iter().map(|(n, v)| json!([n, String::from_utf8_lossy(v)])).collect();
        let body = json!({
            "status": answer.status,
            "headers": headers,
            "body": String::from_utf8_lossy(&answer.body),
        });
        self.change(store_key, "resolve", owner, Some(body.to_string().into_bytes()))
    }

    fn change(&self, store_key: &str, op: &str, owner: Option<&str>, body: Option<Vec<u8>>) -> Result<Outcome, String> {
        let query = owner.map(|o| format!("?owner={o}")).unwrap_or_default();
        let (status, reply) = self.call("POST", &format!("/unknown/{store_key}/{op}{query}"), body.as_deref())?;
        let text = |f: &str| reply.get(f).and_then(Value::as_str).unwrap_or_default().to_string();
        Ok(Outcome { changed: status == 200, result: text("result"), message: text("message") })
    }

    /// One call; a refusal (400, 401, 5xx) is an error with the listener's own message.
    fn call(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<(u16, Value), String> {
        let where_ = format!("the admin listener at http://{}:{}", self.target.host, self.target.port);
        let answer =
            http::call(&self.target, method, path, &self.secret, body).map_err(|e| format!("{where_}: {e}"))?;
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        if matches!(answer.status, 200 | 404 | 409) && value.get("result").is_some() || answer.status == 200 {
            return Ok((answer.status, value));
        }
        let message = value.get("message").and_then(Value::as_str).map(str::to_string);
        Err(format!(
            "{where_} answered {}: {}",
            answer.status,
            message.unwrap_or_else(|| String::from_utf8_lossy(&answer.body).into_owned())
        ))
    }
}
