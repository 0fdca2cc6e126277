//! The root context: configures the worker, and turns its callbacks (tick, wake-up queue,
//! answers of the calls it owns) into the [`Worker`](crate::lifecycle::Worker)'s events.

use super::abi;
use super::envoy::Envoy;
use super::request::Request;
use crate::host::{Host, Level};
use crate::lifecycle::{Stream, Worker};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

pub(super) struct Root {
    pub(super) id: u32,
    pub(super) worker: Option<Rc<Worker>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        if let Some(w) = &self.worker {
            w.on_call_response(&Envoy::entered(), token, num_headers, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(true) = abi::dequeue(queue_id) {}
        if let Some(w) = &self.worker {
            w.on_queue_ready(&Envoy::entered());
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match abi::buffer(abi::buffer::PLUGIN_CONFIGURATION, 0, usize::MAX) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(s) => {
                let line = format!("idem: invalid policy: cannot read plugin configuration: status {s}");
                Envoy::entered().log(Level::Critical, &line);
                return false;
            }
        };
        let host = Envoy::entered();
        match Worker::configure(&host, &host, self.id, &config) {
            Ok(w) => {
                self.worker = Some(Rc::new(w));
                true
            }
            Err(line) => {
                host.log(Level::Critical, &line);
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(w) = &self.worker {
            w.on_tick(&Envoy::entered());
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let w = Rc::clone(self.worker.as_ref()?);
        Some(Box::new(Request(Stream::new(w, context_id))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
