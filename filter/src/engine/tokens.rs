//! The token mechanism's issue endpoint and the stored identity of a token.

use super::{key_error, store_unavailable, verdict, Action, Engine, Issue, Outcome, Verdict};
use crate::codes::ErrorCode;
use crate::key::{self, KeyError, RequestView};
use crate::policy::RouteId;
use crate::policy::{Mode, RoutePolicy};
use crate::response;
use crate::store::StoreError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a token: 16 random, then the first 8 of its HMAC-SHA256 tag.
const RANDOM_LEN: usize = 16;
const TAG_LEN: usize = 8;

impl Engine {
    /// Whether `path` is some token route's issue endpoint (cheap: no allocation).
    pub fn is_issue_path(&self, path: &str) -> bool {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        self.bundle.routes.iter().any(|r| r.mode == Mode::Token && r.token.issue_path == bare)
    }

    /// The token issue endpoint: which route, a fresh token, or the answer when none is issued.
    /// `random` supplies 16 random bytes.
    pub fn issue(&self, method: &str, path: &str, req: &dyn RequestView, random: [u8; 16]) -> Option<Issue> {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        let routes: Vec<RouteId> = self
            .bundle
            .route_ids()
            .filter(|&r| self.bundle.route(r).mode == Mode::Token && self.bundle.route(r).token.issue_path == bare)
            .collect();
        let first = *routes.first()?;
        if !method.eq_ignore_ascii_case("POST") {
            let mut reply =
                crate::replies::plain_error(ErrorCode::TokenMethodNotAllowed, "tokens are issued with POST");
            reply.headers.push(("allow".into(), "POST".into()));
            return Some(Issue::Reply { route: Some(first), reply, cause: "method_not_allowed".into() });
        }
        let route = if routes.len() == 1 {
            first
        } else {
            let wanted = key::query_param(path, "route").ok().flatten();
            match routes.iter().find(|&&r| Some(&self.bundle.route(r).name) == wanted.as_ref()) {
                Some(&r) => r,
                None => {
                    let names: Vec<&str> = routes.iter().map(|&r| self.bundle.route(r).name.as_str()).collect();
                    let reply = crate::replies::plain_error(
                        ErrorCode::TokenRouteRequired,
                        &format!("several routes issue tokens here; add ?route= one of: {}", names.join(", ")),
                    );
                    return Some(Issue::Reply { route: None, reply, cause: "route_required".into() });
                }
            }
        };
        let policy = self.policy(route);
        let token = self.signed_token(&policy.name, random);
        match token_id(policy, &token, req) {
            Ok(id) => Some(Issue::Token { route, token, id }),
            Err(e) => {
                let v = key_error(policy, e);
                let Action::Reply(reply) = v.action else {
                    return None;
                };
                Some(Issue::Reply { route: Some(route), reply, cause: v.cause })
            }
        }
    }

    /// A token for `route`: 128 random bits and a 64-bit tag over the route's name and them,
    /// base64url (32 characters).
    pub fn signed_token(&self, route: &str, random: [u8; RANDOM_LEN]) -> String {
        let mut bytes = random.to_vec();
        bytes.extend_from_slice(&self.token_mac(route, &random).finalize().into_bytes()[..TAG_LEN]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Whether `token` is one this gateway issued for `route` (mistyped, cut short, made up or
    /// another route's: no). Says nothing about whether it was used or has expired.
    pub fn issued_here(&self, route: &str, token: &str) -> bool {
        let Ok(bytes) = URL_SAFE_NO_PAD.decode(token) else {
            return false;
        };
        let Some((random, tag)) = bytes.split_at_checked(RANDOM_LEN) else {
            return false;
        };
        tag.len() == TAG_LEN && self.token_mac(route, random).verify_truncated_left(tag).is_ok()
    }

    /// HMAC-SHA256 keyed by `[tokens] secret` (hashed), or by the shared store's per-process
    /// secret, over the route's name and the token's random bytes.
    fn token_mac(&self, route: &str, random: &[u8]) -> Hmac<Sha256> {
        let secret: &[u8] = match &self.bundle.tokens.secret {
            Some(configured) => configured.as_bytes(),
            None => &self.shared.secret(),
        };
        // A key shorter than SHA-256's 64-byte block is zero-padded by HMAC: this is that key.
        let mut key = [0u8; 64];
        key[..32].copy_from_slice(&Sha256::new().chain_update(b"idem token key v1\0").chain_update(secret).finalize());
        let mut mac = <Hmac<Sha256> as hmac::digest::KeyInit>::new(&key.into());
        mac.update(route.as_bytes());
        mac.update(&[0]);
        mac.update(random);
        mac
    }

    /// The answer to a successful issue (or the store's failure).
    pub fn issued(&self, route: RouteId, token: &str, now: u64, stored: Result<(), StoreError>) -> Verdict {
        let policy = self.policy(route);
        if let Err(e) = stored {
            return verdict(Outcome::StoreError, store_unavailable(&policy.answers), &e.to_string(), None);
        }
        let ttl = policy.token.ttl.millis;
        let mut reply = response::json_reply(
            200,
            "TOKEN_ISSUED",
            "send this token once, in the named header",
            &[
                ("token", token.into()),
                ("header", policy.token.header.clone().into()),
                ("expires_at", response::rfc3339(now.saturating_add(ttl)).into()),
                ("ttl_seconds", (ttl / 1000).into()),
            ],
        );
        reply.headers.push(("cache-control".into(), "no-store".into()));
        verdict(Outcome::TokenIssued, reply, "issued", Some(token.to_string()))
    }
}

/// The stored identity of a token: route + caller scope + token, as for keys, in its own domain.
pub(super) fn token_id(policy: &RoutePolicy, token: &str, req: &dyn RequestView) -> Result<[u8; 32], KeyError> {
    let scope = (&policy.token.scope, policy.token.anonymous);
    key::scoped_id(&format!("token:{}", policy.name), scope.0, scope.1, token, policy.template(), req)
}
