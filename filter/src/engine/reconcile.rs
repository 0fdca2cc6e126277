//! Reconciling an unknown outcome (`[route.reconcile]`): a repeat that meets one takes the
//! lookup (one at a time per key), asks the service, and what the service says decides the key —
//! it ran (its answer becomes the key's answer), it did not (the repeat runs as the first
//! request), or nobody knows (409 as without a lookup).

use super::{shadowed, Action, Engine, Outcome, Prepared, StoreTicket, Ticket, Verdict};
use crate::policy::Found;
use crate::response::{Header, LocalReply, StoredResponse};

/// The header a reconciled answer carries (beside `Idempotent-Replayed: true`): the answer is the
/// lookup's, not the first attempt's.
pub const RECONCILED_HEADER: &str = "idempotency-reconciled";

/// What the lookup answered.
pub struct LookupAnswer {
    /// 0 when no answer came (reset, refused, timed out).
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
    /// A gRPC answer's trailers (its `grpc-status`), when the answer is one.
    pub trailers: Vec<Header>,
}

impl LookupAnswer {
    /// The answer a gRPC client takes: a lookup beside a gRPC service answers the reply message,
    /// as `application/x-protobuf` (or `application/protobuf`, `application/octet-stream`: the
    /// message bytes, framed here) or `application/grpc` (already framed); the client gets it
    /// with `grpc-status: 0`. Anything else (JSON, say) cannot be a gRPC reply: `Err` with why.
    pub fn into_grpc(self) -> Result<LookupAnswer, String> {
        let content_type = self
            .headers
            .iter()
            .find(|(n, _)| n == "content-type")
            .map(|(_, v)| String::from_utf8_lossy(v).to_ascii_lowercase())
            .unwrap_or_default();
        let media = content_type.split(';').next().unwrap_or("").trim().to_string();
        let body = match media.as_str() {
            m if m.starts_with("application/grpc") => self.body,
            "application/x-protobuf" | "application/protobuf" | "application/octet-stream" => {
                let len = u32::try_from(self.body.len()).map_err(|_| "a lookup message over 4 GiB".to_string())?;
                let mut framed = Vec::with_capacity(5 + self.body.len());
                framed.push(0);
                framed.extend_from_slice(&len.to_be_bytes());
                framed.extend_from_slice(&self.body);
                framed
            }
            other => return Err(format!("lookup_not_grpc: a gRPC call's lookup answered {other:?}, not a message")),
        };
        let metadata = self.headers.into_iter().filter(|(n, _)| n.starts_with("x-") || n.starts_with("grpc-"));
        let mut headers = vec![("content-type".to_string(), b"application/grpc".to_vec())];
        headers.extend(metadata.filter(|(n, _)| !n.starts_with("grpc-")));
        Ok(LookupAnswer {
            status: self.status,
            headers,
            body,
            trailers: vec![("grpc-status".to_string(), b"0".to_vec())],
        })
    }
}

impl Engine {
    /// The lookup's path for the request's key.
    pub fn lookup_path(&self, p: &Prepared) -> Option<String> {
        let reconcile = self.policy(p.route).reconcile.as_ref()?;
        Some(reconcile.lookup.render(&p.key))
    }

    /// What a lookup's answer says: ran, absent, or nothing settled.
    pub fn lookup_found(&self, p: &Prepared, status: u16) -> Found {
        self.policy(p.route).reconcile.as_ref().map_or(Found::Failed, |r| r.found(status))
    }

    /// The verdict of a lookup that settled nothing: the 409, or the request forwarded in
    /// shadow mode.
    pub fn lookup_settled_nothing(&self, p: &Prepared, unknown: LocalReply, cause: String) -> Verdict {
        let key = Some(p.key.clone());
        shadowed(self.policy(p.route), Outcome::ReconcileFailed, unknown, cause, key)
    }
}

/// The lookup said the first attempt ran and its answer is the key's now: the repeat gets it,
/// marked as a replay of a reconciled answer.
pub fn reconciled_ran(p: &Prepared, stored: &StoredResponse) -> Verdict {
    let mut reply = stored.replay();
    reply.headers.push((RECONCILED_HEADER.into(), b"true".to_vec()));
    let cause = format!("lookup_ran:{}", stored.status);
    Verdict { outcome: Outcome::ReconciledRan, action: Action::Reply(reply), cause, key: Some(p.key.clone()) }
}

/// The lookup said the first attempt did not run and the key is the repeat's claim: it runs.
pub fn reconciled_absent(p: &Prepared, claim: StoreTicket, status: u16) -> Verdict {
    Verdict {
        outcome: Outcome::ReconciledAbsent,
        action: Action::Forward(Some(Ticket::Claim(claim))),
        cause: format!("lookup_absent:{status}"),
        key: Some(p.key.clone()),
    }
}

/// Why a lookup settled nothing: no answer (0), or a status neither `ran` nor `absent`.
pub fn failed_cause(status: u16) -> String {
    if status == 0 {
        "lookup_no_answer".into()
    } else {
        format!("lookup_status:{status}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::LookupAnswer;

    fn answer(content_type: &str, body: &[u8]) -> LookupAnswer {
        LookupAnswer {
            status: 200,
            headers: vec![
                ("content-type".into(), content_type.as_bytes().to_vec()),
                ("x-order".into(), b"7".to_vec()),
                ("set-cookie".into(), b"s=1".to_vec()),
            ],
            body: body.to_vec(),
            trailers: Vec::new(),
        }
    }

    #[test]
    fn a_lookup_message_becomes_a_grpc_reply() {
        let g = answer("application/x-protobuf", b"order-1").into_grpc().unwrap();
        assert_eq!(g.body, [&[0, 0, 0, 0, 7][..], b"order-1"].concat(), "framed: no compression, length 7");
        assert_eq!(g.trailers, vec![("grpc-status".to_string(), b"0".to_vec())]);
        assert_eq!(
            g.headers,
            vec![("content-type".to_string(), b"application/grpc".to_vec()), ("x-order".to_string(), b"7".to_vec())]
        );
        let framed = [&[0, 0, 0, 0, 2][..], b"ok"].concat();
        assert_eq!(answer("application/grpc+proto", &framed).into_grpc().unwrap().body, framed, "already framed");
        let e = answer("application/json; charset=utf-8", b"{}").into_grpc().err().unwrap();
        assert!(e.starts_with("lookup_not_grpc") && e.contains("application/json"), "{e}");
    }
}
