//! idem-lint: the 幂等性说明 gate for OpenAPI specs (see issue 3).
