//! Envoy's contexts of one VM as the module's exports see them: root contexts (a [`Worker`] once
//! configured) and streams, and where each callout's reply goes.
//!
//! This is the dispatcher proxy-wasm SDKs ship, owned here so that nothing it decides is hidden:
//! a reply is routed by its callout token to the owner recorded when the call was sent
//! ([`Worker::reply_owner`]), never to whichever context happened to be current at dispatch —
//! the SDK's rule, which sent a Webdis reply to the wrong owner once idem switched contexts
//! itself. Host-independent: the glue calls it from each export, and the tests drive it as Envoy
//! does, under [`crate::testing::FakeHost`].

use super::worker::ReplyTo;
use super::{Flow, Map, Stream, Worker};
use crate::host::{Host, Level, Setup};
use std::rc::Rc;

/// The contexts of one VM.
#[derive(Default)]
pub struct Contexts {
    /// Root contexts by id: their worker once configured (a plugin that refused its policy has none).
    roots: Map<u32, Option<Rc<Worker>>>,
    /// Streams by context id, with their root's id.
    streams: Map<u32, (u32, Stream)>,
}

impl Contexts {
    /// Envoy created a context: a root (`root_id == 0`), or a stream of that root.
    pub fn create(&mut self, id: u32, root_id: u32) {
        if root_id == 0 {
            self.roots.entry(id).or_insert(None);
            return;
        }
        // A stream of a root with no worker (its policy refused to load) is not ours: every
        // callback for it finds nothing and continues.
        if let Some(Some(worker)) = self.roots.get(&root_id) {
            self.streams.insert(id, (root_id, Stream::new(Rc::clone(worker), id)));
        }
    }

    /// A root context's plugin configuration. `false` makes Envoy refuse the plugin.
    pub fn configure(&mut self, setup: &dyn Setup, host: &dyn Host, id: u32, config: &[u8]) -> bool {
        match Worker::configure(setup, host, id, config) {
            Ok(w) => {
                self.roots.insert(id, Some(Rc::new(w)));
                true
            }
            Err(line) => {
                host.log(Level::Critical, &line);
                false
            }
        }
    }

    fn worker(&self, root: u32) -> Option<&Rc<Worker>> {
        self.roots.get(&root).and_then(Option::as_ref)
    }

    /// The stream of context `id`, if it is one of ours.
    pub fn stream(&mut self, id: u32) -> Option<&mut Stream> {
        self.streams.get_mut(&id).map(|(_, s)| s)
    }

    /// A root's timer.
    pub fn on_tick(&self, host: &dyn Host, id: u32) {
        if let Some(w) = self.worker(id) {
            w.on_tick(host);
        }
    }

    /// A root's wake-up queue was signalled.
    pub fn on_queue_ready(&self, host: &dyn Host, id: u32) {
        if let Some(w) = self.worker(id) {
            w.on_queue_ready(host);
        }
    }

    /// A callout's reply, delivered by Envoy on context `id` (where the call was kept, and where
    /// its headers and body can be read: they are read there, first). It goes to the owner its
    /// token was recorded with, wherever Envoy delivered it — a stream owner made the effective
    /// context while it acts, so its resume or answer lands on its own request. A reply nobody
    /// recorded is dropped unread, counted and logged.
    pub fn on_call_response(&mut self, host: &dyn Host, id: u32, token: u32, num_headers: usize, body_size: usize) {
        let root = match self.streams.get(&id) {
            Some((root, _)) => *root,
            None => id,
        };
        let Some(worker) = self.worker(root).cloned() else {
            return;
        };
        let owner = worker.reply_owner(token);
        if owner == ReplyTo::Ended {
            worker.forget_tag(token);
            return worker.ended_calls.answered(token);
        }
        if owner == ReplyTo::Nobody {
            return worker.stray_reply(host, id, token, "no call of this worker has that token");
        }
        let (headers, body) = host.call_response(num_headers, body_size);
        let (headers, body) = worker.checked_reply(host, token, headers, body);
        match owner {
            ReplyTo::Root => worker.on_reply(host, token, headers, body),
            ReplyTo::Stream(owner) => {
                let Some(stream) = self.stream(owner) else {
                    return worker.stray_reply(host, id, token, "its stream has ended");
                };
                let elsewhere = owner != id;
                if elsewhere && host.set_effective_context(owner).is_err() {
                    return worker.stray_reply(host, id, token, "its stream's context is gone");
                }
                stream.on_reply(host, token, &headers, &body);
                if elsewhere {
                    let _ = host.set_effective_context(id);
                }
            }
            ReplyTo::Nobody | ReplyTo::Ended => {}
        }
    }

    /// A stream ended (Envoy's `on_log`).
    pub fn on_log(&mut self, host: &dyn Host, id: u32) {
        if let Some(s) = self.stream(id) {
            s.on_log(host);
        }
    }

    /// Envoy deleted a context.
    pub fn delete(&mut self, id: u32) {
        if self.streams.remove(&id).is_none() {
            self.roots.remove(&id);
        }
    }

    /// A stream callback, or `Continue` for a context that is not one of our streams.
    pub fn on_stream(&mut self, id: u32, event: impl FnOnce(&mut Stream) -> Flow) -> Flow {
        self.stream(id).map_or(Flow::Continue, event)
    }
}
