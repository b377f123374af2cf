//! End-to-end test support for llamad and llamactl.
