//! Redis spoken directly (`[redis] direct`, the native build): the same commands and the same
//! replies as the Webdis path, so one store module ([`super::redis`]) serves both transports and
//! a fleet may mix them on one Redis. A command the store built in Webdis' form (`CMD/arg/…`,
//! each argument percent-encoded) becomes its RESP arguments ([`args`]); the reply, read by the
//! host's Redis client, is answered to the store as Webdis would have answered it
//! ([`webdis_json`]): `{"CMD": value}`, a status as `[true, "OK"]`, an error as
//! `[false, "ERR …"]`, an error inside a list as `null` (Webdis' `json_expand_array`; idem's
//! scripts turn a step's error into an `ERR …` string themselves).

use crate::policy::percent_decode;

/// A Redis reply, as the host's client read it (RESP2's five kinds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`: a status.
    Status(String),
    /// `-ERR …`: an error, code and message as Redis sent them.
    Error(String),
    Integer(i64),
    /// A bulk string; `None` is nil.
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// The RESP arguments of a command in Webdis' form: split at `/`, each part percent-decoded (the
/// store encodes every byte outside `[A-Za-z0-9_~-]`, `/` included). An empty command is an error.
pub fn args(command: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if command.is_empty() {
        return Err("an empty Redis command".into());
    }
    Ok(command.split(|&b| b == b'/').map(percent_decode).collect())
}

/// Webdis' JSON answer to command `name` (its first argument) for `reply`: what the store reads
/// ([`super::redis::reply`]). Bulk strings are read as UTF-8 (idem's records are ASCII; Webdis
/// too answers text), replacing what is not.
pub fn webdis_json(name: &str, reply: &Reply) -> Vec<u8> {
    let value = match reply {
        // A status or an error at the top is a pair, as Webdis answers them.
        Reply::Status(s) => serde_json::json!([true, s]),
        Reply::Error(e) => serde_json::json!([false, e]),
        other => value(other),
    };
    let mut map = serde_json::Map::new();
    map.insert(name.to_string(), value);
    serde_json::Value::Object(map).to_string().into_bytes()
}

fn value(reply: &Reply) -> serde_json::Value {
    match reply {
        Reply::Status(s) => serde_json::Value::String(s.clone()),
        Reply::Error(_) => serde_json::Value::Null,
        Reply::Integer(n) => serde_json::Value::from(*n),
        Reply::Bulk(None) => serde_json::Value::Null,
        Reply::Bulk(Some(bytes)) => serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()),
        Reply::Array(items) => serde_json::Value::Array(items.iter().map(value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::{command, reply};

    #[test]
    fn a_webdis_command_is_its_resp_arguments() {
        let record = "I|00ff|x12/ab|1.5 %";
        let built = command(&["SET", "idem:k:ab", record, "NX", "PX", "30000", "GET"]);
        let want: Vec<&[u8]> = vec![b"SET", b"idem:k:ab", record.as_bytes(), b"NX", b"PX", b"30000", b"GET"];
        assert_eq!(args(built.as_bytes()), Ok(want.into_iter().map(<[u8]>::to_vec).collect()));
        assert!(args(b"").is_err());
        assert_eq!(args(b"GET/"), Ok(vec![b"GET".to_vec(), Vec::new()]));
    }

    #[test]
    fn each_reply_reads_as_the_store_reads_webdis() {
        let ok = webdis_json("SET", &Reply::Status("OK".into()));
        assert_eq!(reply("SET", 200, &ok).ok(), Some(serde_json::json!([true, "OK"])));
        let nil = webdis_json("SET", &Reply::Bulk(None));
        assert_eq!(reply("SET", 200, &nil).ok(), Some(serde_json::Value::Null));
        let found = webdis_json("SET", &Reply::Bulk(Some(b"I|00ff|x|1|2".to_vec())));
        assert_eq!(reply("SET", 200, &found).ok(), Some(serde_json::json!("I|00ff|x|1|2")));
        let batch = Reply::Array(vec![
            Reply::Integer(1),
            Reply::Bulk(Some(b"ERR no".to_vec())),
            Reply::Bulk(None),
            Reply::Error("ERR inner".into()),
            Reply::Array(vec![Reply::Status("QUEUED".into())]),
        ]);
        let batch = webdis_json("EVAL", &batch);
        assert_eq!(reply("EVAL", 200, &batch).ok(), Some(serde_json::json!([1, "ERR no", null, null, ["QUEUED"]])));
        let err = webdis_json("EVAL", &Reply::Error("CROSSSLOT Keys in request don't hash to the same slot".into()));
        assert!(matches!(reply("EVAL", 200, &err), Err(crate::store::StoreError::CrossSlot(_))));
        let err = webdis_json("EVAL", &Reply::Error("OOM command not allowed".into()));
        assert!(matches!(reply("EVAL", 200, &err), Err(crate::store::StoreError::Redis(m)) if m.starts_with("OOM")));
    }
}
