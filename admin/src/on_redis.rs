//! The operator's three operations on Redis. Each change reads the key's record first,
//! checks it is the unknown outcome the operator means, then runs a script that changes the key
//! only if it still holds exactly that record (idem_filter::store::operator).

use crate::resp::{Connection, Error, Reply};
use idem_filter::response::StoredResponse;
use idem_filter::store::operator::{self, Change, Held, RecordKind};

/// One held unknown outcome, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub store_key: String,
    pub held: Held,
}

/// Every claim key under `prefix` that holds an unknown outcome, oldest first.
pub fn list(con: &mut Connection, prefix: &str) -> Result<Vec<Entry>, Error> {
    let pattern = format!("{}k:*", glob_escape(prefix));
    let mut cursor = "0".to_string();
    let mut out = Vec::new();
    loop {
        let reply = con.call(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"])?;
        let Reply::Array(parts) = reply else {
            return Err(Error(format!("unexpected SCAN reply {reply:?}")));
        };
        let (next, keys) = match parts.as_slice() {
            [next, Reply::Array(keys)] => (next.text().unwrap_or_default(), keys),
            _ => return Err(Error("unexpected SCAN reply".into())),
        };
        let keys: Vec<String> =
            keys.iter().filter_map(Reply::text).filter(|k| operator::is_claim_key(prefix, k)).collect();
        let gets: Vec<Vec<&str>> = keys.iter().map(|k| vec!["GET", k.as_str()]).collect();
        let records = con.pipeline(&gets)?;
        for (store_key, record) in keys.into_iter().zip(records) {
            if let Some(held) = record.text().as_deref().and_then(operator::held) {
                out.push(Entry { store_key, held });
            }
        }
        if next == "0" || next.is_empty() {
            break;
        }
        cursor = next;
    }
    out.sort_by(|a, b| (a.held.first_seen_ms, &a.store_key).cmp(&(b.held.first_seen_ms, &b.store_key)));
    Ok(out)
}

/// Releases `store_key` if it holds an unknown outcome (of `owner`, when given): the client's
/// next repeat runs as a first request.
pub fn release(con: &mut Connection, store_key: &str, owner: Option<&str>) -> Result<Change, Error> {
    let (record, held) = match read_held(con, store_key, owner)? {
        Ok(found) => found,
        Err(change) => return Ok(change),
    };
    let reply = con.call(&["EVAL", operator::RELEASE_IF_UNCHANGED, "1", store_key, &record])?;
    after_fenced_write(con, store_key, reply.int() == Some(1), &held)
}

/// Replaces `store_key`'s unknown outcome (of `owner`, when given) with `answer`, kept until the
/// hold would have ended: the client's repeats get it replayed.
pub fn resolve(
    con: &mut Connection,
    store_key: &str,
    owner: Option<&str>,
    answer: &StoredResponse,
) -> Result<Change, Error> {
    let (record, held) = match read_held(con, store_key, owner)? {
        Ok(found) => found,
        Err(change) => return Ok(change),
    };
    let Some(resolved) = operator::resolved(&record, answer) else {
        return Ok(Change::Holds(RecordKind::of(&record)));
    };
    let reply = con.call(&["EVAL", operator::REPLACE_IF_UNCHANGED, "1", store_key, &record, &resolved])?;
    after_fenced_write(con, store_key, reply.int() == Some(1), &held)
}

/// The key's record if it is the unknown outcome meant, else what changed nothing.
fn read_held(
    con: &mut Connection,
    store_key: &str,
    owner: Option<&str>,
) -> Result<Result<(String, Held), Change>, Error> {
    let record = con.call(&["GET", store_key])?.text();
    let Some(record) = record else {
        return Ok(Err(Change::Absent));
    };
    let Some(held) = operator::held(&record) else {
        return Ok(Err(Change::Holds(RecordKind::of(&record))));
    };
    // A lookup asking the service decides the key itself; one whose lease has lapsed does not.
    if held.lookup_lease_ms.is_some_and(|l| l > crate::now_ms()) {
        return Ok(Err(Change::Holds(RecordKind::LookingUp)));
    }
    if let Some(owner) = owner {
        if !owner.eq_ignore_ascii_case(&held.owner) {
            return Ok(Err(Change::OtherOwner(held.owner)));
        }
    }
    Ok(Ok((record, held)))
}

/// A fenced write that did not apply lost a race with the filter: say what the key holds now.
fn after_fenced_write(con: &mut Connection, store_key: &str, applied: bool, held: &Held) -> Result<Change, Error> {
    if applied {
        return Ok(Change::Done);
    }
    let now = con.call(&["GET", store_key])?.text();
    Ok(match now.as_deref() {
        None => Change::Absent,
        Some(r) => match operator::held(r) {
            Some(h) if h.owner != held.owner => Change::OtherOwner(h.owner),
            _ => Change::Holds(RecordKind::of(r)),
        },
    })
}

/// `SCAN MATCH` treats `* ? [ ] \` as a pattern: a prefix is matched literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(super::glob_escape("idem:"), "idem:");
        assert_eq!(super::glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
