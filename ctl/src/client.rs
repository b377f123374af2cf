//! A blocking client of llamad's admin API (`ureq`, plain HTTP: the API listens on loopback or a private
//! address; TLS belongs to a reverse proxy).
//!
//! `ureq` rather than `reqwest`: the CLI is synchronous, and `ureq` brings no async runtime (reqwest's
//! blocking client runs a tokio runtime on a thread), which keeps `llamactl`'s build and binary small.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use llamad_api::ErrorBody;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Default server URL.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50053";
/// Token files tried, in order, when none is given: the packaged location, then the daemon's default
/// (`<state dir>/admin.token`).
pub const DEFAULT_TOKEN_FILES: &[&str] = &["/etc/llamad/admin.token", "/var/lib/llamad/admin.token"];

/// The server answered with an error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// HTTP status.
    pub status: u16,
    /// The body (`code` + `message`).
    pub body: ErrorBody,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server answered {} ({}): {}", self.status, self.body.code, self.body.message)?;
        if self.body.code == llamad_api::code::UNAUTHENTICATED
            || self.body.code == llamad_api::code::FORBIDDEN
        {
            write!(f, " (check --token-file / LLAMACTL_TOKEN_FILE)")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiFailure {}

/// The client.
pub struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
    stream_agent: ureq::Agent,
}

/// Reads the token from `path`, or from the first readable default file.
pub fn read_token(path: Option<&Path>) -> Result<Option<String>> {
    match path {
        Some(p) => {
            let s = std::fs::read_to_string(p).with_context(|| format!("token file {}", p.display()))?;
            Ok(Some(s.trim().to_string()))
        }
        None => Ok(DEFAULT_TOKEN_FILES
            .iter()
            .map(PathBuf::from)
            .find_map(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.trim().to_string())),
    }
}

fn agent(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(timeout).build().into()
}

impl Client {
    /// A client of `server` (`http://host:port`) with an optional bearer token.
    /// `server` is a URL, or `host:port` for `http://host:port`.
    pub fn new(server: &str, token: Option<String>) -> Client {
        let base = server.trim_end_matches('/');
        Client {
            base: if base.contains("://") { base.to_string() } else { format!("http://{base}") },
            token,
            agent: agent(Some(Duration::from_secs(120))),
            stream_agent: agent(None),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    fn finish<T: DeserializeOwned>(
        &self,
        what: &str,
        rsp: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<T> {
        let mut rsp = rsp.with_context(|| format!("{what} ({})", self.base))?;
        let status = rsp.status().as_u16();
        let text = rsp.body_mut().read_to_string().with_context(|| format!("{what}: reading the answer"))?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).with_context(|| format!("{what}: unexpected answer"));
        }
        let body = serde_json::from_str::<ErrorBody>(&text)
            .unwrap_or_else(|_| ErrorBody::new("http", format!("status {status}: {}", text.trim())));
        Err(ApiFailure { status, body }.into())
    }

    /// `GET path`.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let r = self.auth(self.agent.get(self.url(path))).call();
        self.finish(&format!("GET {path}"), r)
    }

    /// `POST path` with a JSON body.
    pub fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        let r = self.auth(self.agent.post(self.url(path))).send_json(body);
        self.finish(&format!("POST {path}"), r)
    }

    /// `POST path` without a body.
    pub fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let r = self.auth(self.agent.post(self.url(path))).send_empty();
        self.finish(&format!("POST {path}"), r)
    }

    /// `DELETE path`.
    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let r = self.auth(self.agent.delete(self.url(path))).call();
        self.finish(&format!("DELETE {path}"), r)
    }

    /// `GET path` as server-sent events: `on_event(event, data)` for each until it returns false or the
    /// stream ends.
    pub fn events(&self, path: &str, mut on_event: impl FnMut(&str, &str) -> Result<bool>) -> Result<()> {
        let what = format!("GET {path}");
        let rsp = self
            .auth(self.stream_agent.get(self.url(path)))
            .call()
            .with_context(|| format!("{what} ({})", self.base))?;
        let status = rsp.status().as_u16();
        if !(200..300).contains(&status) {
            return self.finish(&what, Ok(rsp));
        }
        let mut reader = BufReader::new(rsp.into_body().into_reader());
        let (mut event, mut data) = (String::new(), String::new());
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).with_context(|| format!("{what}: reading events"))? == 0 {
                return Ok(());
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if !event.is_empty() && !on_event(&event, &data)? {
                    return Ok(());
                }
                event.clear();
                data.clear();
            } else if let Some(v) = l.strip_prefix("event:") {
                event = v.trim_start().to_string();
            } else if let Some(v) = l.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
    }
}

/// Percent-encodes one path segment (worker addresses hold `:` and, for IPv6, brackets).
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_host_and_port_is_http() {
        assert_eq!(Client::new("127.0.0.1:50053", None).url("/v1/x"), "http://127.0.0.1:50053/v1/x");
        assert_eq!(Client::new("https://h:1/", None).url("/v1/x"), "https://h:1/v1/x");
    }
}
