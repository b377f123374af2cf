//! `llamad`: the worker daemon library (RPC server, cache, admin API).
