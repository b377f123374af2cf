//! Admin API tests (one binary).
