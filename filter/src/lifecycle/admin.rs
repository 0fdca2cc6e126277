//! The operator's listener (`role = "admin"`): the shared store's unknown outcomes, listed,
//! released or resolved over HTTP. Every call carries `authorization: Bearer <[admin] secret>`;
//! the instance answers every request itself (nothing is forwarded) once the request has ended.
//!
//! | call | answer |
//! |---|---|
//! | `GET /unknown` | 200, a JSON array: `store_key`, `route`, `key_prefix`, `owner`, `first_seen_at`, `held_until`, `looking_up` |
//! | `POST /unknown/<store_key>/release[?owner=<hex>]` | 200 `released`; 404 `absent`; 409 `unchanged` |
//! | `POST /unknown/<store_key>/resolve[?owner=<hex>]` with `{"status":201,"headers":[["n","v"]],"body":"…"}` | 200 `resolved`; 404; 409 |
//! | `GET /keys/<scoped id, 64 hex>` | 200, what the key holds: `state` (`absent`, `claimed`, `completed`, `unknown_outcome`), `store_key`, `owner`, `first_seen_at`, and `lease_ends_at`, `status` and `answer_kept`, or `held_until` and `looking_up` |
//!
//! Malformed calls get 400 with what is wrong; a missing or wrong secret 401.

use super::worker::send;
use crate::host::{Host, Level};
use crate::pairs::Headers;
use crate::policy::AdminConfig;
use crate::policy::SharedConfig;
use crate::response::{json_reply, rfc3339, LocalReply, StoredResponse};
use crate::store::operator::Change;
use crate::store::shared::held::parse_store_key;
use crate::store::shared::SharedStore;
use serde_json::json;

/// The largest resolve body read (an answer and its headers).
pub(super) const MAX_ADMIN_BODY: usize = 1 << 20;

/// `GET /keys/<id>`: what the store holds for a scoped id (`idem-admin show` computes it).
fn inspect(host: &dyn Host, store: &SharedStore, method: &[u8], hex: &str) -> LocalReply {
    if method != b"GET" {
        return json_reply(405, "METHOD_NOT_ALLOWED", "GET /keys/<id> shows a key", &[]);
    }
    let mut id = [0u8; 32];
    let parsed = hex.len() == 64
        && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && id.iter_mut().enumerate().all(|(i, byte)| {
            let pair = hex.get(2 * i..2 * i + 2).and_then(|p| u8::from_str_radix(p, 16).ok());
            pair.map(|v| *byte = v).is_some()
        });
    if !parsed {
        return json_reply(
            400,
            "BAD_ID",
            "expected the key's scoped id: 64 lowercase hex digits (`idem-admin show` computes it)",
            &[],
        );
    }
    match store.inspect(host, &id) {
        Ok((state, store_key)) => {
            LocalReply::new(200, "application/json", state.to_json(&store_key).to_string().into_bytes())
        }
        Err(e) => json_reply(503, "STORE_ERROR", &format!("{e}"), &[]),
    }
}

/// Answers one call of the admin listener: `head` holds the request's headers, `body` its body.
pub(super) fn answer(host: &dyn Host, cfg: &AdminConfig, shared: &SharedConfig, head: &Headers, body: &[u8]) {
    let reply = decide(host, cfg, shared, head, body);
    send(host, reply);
}

fn decide(host: &dyn Host, cfg: &AdminConfig, shared: &SharedConfig, head: &Headers, body: &[u8]) -> LocalReply {
    let header = |name: &[u8]| head.get(name);
    if !authorized(cfg, header(b"authorization")) {
        let mut r = json_reply(401, "UNAUTHORIZED", "missing or wrong bearer secret ([admin] secret)", &[]);
        r.headers.push(("www-authenticate".into(), b"Bearer".to_vec()));
        return r;
    }
    let method = header(b":method").unwrap_or_default();
    let path = String::from_utf8_lossy(header(b":path").unwrap_or_default()).into_owned();
    let (path, query) = path.split_once('?').unwrap_or((path.as_str(), ""));
    let store = match SharedStore::new(shared).attach(host) {
        Ok(Some(store)) => store,
        Ok(None) => {
            return json_reply(
                503,
                "STORE_NOT_FOUND",
                "no gateway created a shared store in this namespace: the admin instance needs the gateway's vm_id and its [shared] namespace (or plugin name)",
                &[],
            )
        }
        Err(e) => return json_reply(503, "STORE_ERROR", &format!("{e}"), &[]),
    };
    if path == "/unknown" {
        if method != b"GET" {
            return json_reply(
                405,
                "METHOD_NOT_ALLOWED",
                "GET /unknown lists; POST /unknown/<store_key>/release or /resolve changes one",
                &[],
            );
        }
        return match store.held(host) {
            Ok(held) => {
                let rows: Vec<serde_json::Value> = held
                    .iter()
                    .map(|e| {
                        json!({
                            "store_key": e.store_key(),
                            "owner": format!("{:016x}", e.owner),
                            "first_seen_at": rfc3339(e.first_seen_ms),
                            "held_until": rfc3339(e.held_until_ms),
                            "looking_up": e.looking_up,
                            "route": e.note.as_ref().map(|n| n.route.as_str()),
                            "key_prefix": e.note.as_ref().and_then(|n| n.key_prefix.as_deref()),
                        })
                    })
                    .collect();
                LocalReply::new(200, "application/json", serde_json::Value::Array(rows).to_string().into_bytes())
            }
            Err(e) => json_reply(503, "STORE_ERROR", &format!("{e}"), &[]),
        };
    }
    if let Some(hex) = path.strip_prefix("/keys/") {
        return inspect(host, &store, method, hex);
    }
    let Some(rest) = path.strip_prefix("/unknown/") else {
        return json_reply(
            404,
            "NOT_FOUND",
            "the admin listener serves GET /unknown, POST /unknown/<store_key>/release|resolve and GET /keys/<id>",
            &[],
        );
    };
    let Some((key, op)) = rest.rsplit_once('/') else {
        return json_reply(
            404,
            "NOT_FOUND",
            "expected /unknown/<store_key>/release or /unknown/<store_key>/resolve",
            &[],
        );
    };
    if method != b"POST" {
        return json_reply(405, "METHOD_NOT_ALLOWED", "release and resolve are POST", &[]);
    }
    let Some((bucket, id)) = parse_store_key(key) else {
        return json_reply(
            400,
            "BAD_STORE_KEY",
            &format!("{key:?} is not a shared-store key: expected s:<bucket>:<32 lowercase hex digits> (the store_key of GET /unknown or of the unknown_outcome log line)"),
            &[],
        );
    };
    let owner = match query_owner(query) {
        Ok(owner) => owner,
        Err(message) => return json_reply(400, "BAD_OWNER", &message, &[]),
    };
    let (done, change) = match op {
        "release" => ("released", store.operator_release(host, bucket, &id, owner)),
        "resolve" => match parse_answer(body) {
            Ok(answer) => ("resolved", store.operator_resolve(host, bucket, &id, owner, &answer)),
            Err(message) => return json_reply(400, "BAD_ANSWER", &message, &[]),
        },
        _ => {
            return json_reply(
                404,
                "NOT_FOUND",
                "expected /unknown/<store_key>/release or /unknown/<store_key>/resolve",
                &[],
            )
        }
    };
    let change = match change {
        Ok(change) => change,
        Err(e) => return json_reply(503, "STORE_ERROR", &format!("{e}"), &[]),
    };
    if change == Change::Done {
        host.log(Level::Warn, &format!("idem: admin {done} {key}"));
    }
    reply_for(key, done, &change)
}

/// What a release or resolve did: 200 when it changed the key, 404 when the key is gone, 409
/// when it holds something else now.
fn reply_for(key: &str, done: &str, change: &Change) -> LocalReply {
    let status = match change {
        Change::Done => 200,
        Change::Absent => 404,
        Change::Holds(_) | Change::OtherOwner(_) => 409,
    };
    let (result, message) = change.describe(done, key);
    let body = json!({ "store_key": key, "result": result, "message": message });
    LocalReply::new(status, "application/json", body.to_string().into_bytes())
}

/// Compares the bearer secret in constant time (no early exit on the first differing byte).
fn authorized(cfg: &AdminConfig, authorization: Option<&[u8]>) -> bool {
    let Some(given) = authorization.and_then(|v| v.strip_prefix(b"Bearer ")) else {
        return false;
    };
    let want = cfg.secret.as_bytes();
    let mut diff = u8::from(given.len() != want.len());
    for (i, w) in want.iter().enumerate() {
        diff |= w ^ given.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// `owner=<16 hex digits>` from the query, if given.
fn query_owner(query: &str) -> Result<Option<u64>, String> {
    let mut owner = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "owner" || owner.is_some() {
            return Err(format!(
                "query parameter {name:?}: only one `owner` (16 hex digits, as GET /unknown lists it)"
            ));
        }
        let valid = value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit());
        owner = match u64::from_str_radix(value, 16) {
            Ok(o) if valid => Some(o),
            _ => return Err(format!("owner {value:?} is not 16 hex digits (as GET /unknown lists it)")),
        };
    }
    Ok(owner)
}

/// A resolve's answer: `{"status": 200–599, "headers": [["name", "value"], …], "body": "…"}`.
fn parse_answer(body: &[u8]) -> Result<StoredResponse, String> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("the resolve body is not JSON ({e}): expected {{\"status\":200,\"headers\":[[\"name\",\"value\"]],\"body\":\"…\"}}"))?;
    let status = v.get("status").and_then(serde_json::Value::as_u64).filter(|s| (200..=599).contains(s));
    let Some(status) = status else {
        return Err("`status` must be a number from 200 to 599".into());
    };
    let mut headers = Vec::new();
    for h in v.get("headers").and_then(serde_json::Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        let pair = h.as_array().map(Vec::as_slice);
        let Some([serde_json::Value::String(name), serde_json::Value::String(value)]) = pair else {
            return Err(format!("a header is [\"name\", \"value\"], not {h}"));
        };
        let token =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!("header {name:?}: a token name and a value without CR, LF or NUL"));
        }
        headers.push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
    }
    let body = match v.get("body") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::String(s)) => s.clone().into_bytes(),
        Some(other) => return Err(format!("`body` is a string, not {other}")),
    };
    Ok(StoredResponse::new(status as u16, headers, body))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_the_exact_secret_is_authorized() {
        let cfg = AdminConfig { secret: "s".repeat(32) };
        let good = format!("Bearer {}", "s".repeat(32));
        assert!(authorized(&cfg, Some(good.as_bytes())));
        for bad in [
            format!("Bearer {}", "s".repeat(31)),
            format!("Bearer {}t", "s".repeat(32)),
            "s".repeat(32),
            format!("bearer {}", "s".repeat(32)),
        ] {
            assert!(!authorized(&cfg, Some(bad.as_bytes())), "{bad}");
        }
        assert!(!authorized(&cfg, None));
    }

    #[test]
    fn answers_and_owners_are_read_strictly() {
        let a = parse_answer(br#"{"status":201,"headers":[["X-Order","7"]],"body":"{\"a\":1}"}"#).unwrap();
        assert_eq!(
            (a.status, a.headers.clone(), a.body.clone()),
            (201, vec![("x-order".into(), b"7".to_vec())], br#"{"a":1}"#.to_vec())
        );
        for bad in [
            &b"{"[..],
            br#"{"status":700}"#,
            br#"{"status":200,"headers":[["a b","1"]]}"#,
            br#"{"status":200,"headers":[["a","1\r\nx: y"]]}"#,
            br#"{"status":200,"body":5}"#,
        ] {
            assert!(parse_answer(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(query_owner("owner=00000000000000ab").unwrap(), Some(0xab));
        assert_eq!(query_owner("").unwrap(), None);
        for bad in ["owner=xyz", "owner=+0000000000000ab", "key=1", "owner=00000000000000ab&owner=00000000000000ac"] {
            assert!(query_owner(bad).is_err(), "{bad}");
        }
    }
}
