//! A route of a bundle: a handle only the bundle makes (by matching a request, or listing its
//! routes), so every handle names a route that exists. The lifecycle carries handles, not
//! positions; the policy behind one is [`Bundle::route`], with nothing to fall back on.

use super::{Bundle, RoutePolicy};

/// A route of one bundle. Made only here: a worker's bundle never changes after it is parsed,
/// and its handles never leave it, so [`Bundle::route`] always finds the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteId(usize);

impl RouteId {
    /// The route's position in the bundle (counter tables are kept per route).
    pub fn index(self) -> usize {
        self.0
    }
}

impl Bundle {
    /// The policy of a route this bundle handed out.
    pub fn route(&self, id: RouteId) -> &RoutePolicy {
        // In range by construction (see `RouteId`); indexing states that.
        &self.routes[id.0]
    }

    /// Every route, in the order of the bundle.
    pub fn route_ids(&self) -> impl Iterator<Item = RouteId> + '_ {
        (0..self.routes.len()).map(RouteId)
    }

    /// The handle of the route at `index`, if there is one.
    pub(super) fn route_at(&self, index: usize) -> Option<RouteId> {
        (index < self.routes.len()).then_some(RouteId(index))
    }
}
