//! `llamad-api`: request and response types of llamad's admin API (`/v1/`).
