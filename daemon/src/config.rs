//! Configuration: a TOML file, then `LLAMAD__SECTION__KEY` environment variables, then flags.
//!
//! The raw layer ([`RawConfig`]) mirrors the file with every field optional and unknown keys refused;
//! [`Config`] is the validated result the server runs with (ripgrep's lowargs/hiargs split).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

/// Default configuration file, read when present and no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/llamad/llamad.toml";
/// Default RPC port (as `ggml-rpc-server`).
pub const DEFAULT_PORT: u16 = 50052;
/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "LLAMAD__";
/// The devices this build has.
pub const DEVICES: &[&str] = &["CPU"];

/// A size in bytes, written as an integer or as a string with a unit (`"8G"`, `"512MiB"`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum RawSize {
    /// Plain bytes.
    Bytes(u64),
    /// A number with an optional unit.
    Text(String),
}

impl RawSize {
    fn bytes(&self, key: &str) -> Result<u64> {
        match self {
            RawSize::Bytes(b) => Ok(*b),
            RawSize::Text(s) => {
                parse_size(s).ok_or_else(|| Error::Config(format!("{key}: invalid size `{s}`")))
            }
        }
    }
}

/// `[server]`: where and how the RPC server runs.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Address to bind: an IPv4/IPv6 literal or a host name. Default `127.0.0.1`.
    pub host: Option<String>,
    /// TCP port. Default 50052.
    pub port: Option<u16>,
    /// RPC protocol major version announced on `port`: 8 (llama.cpp b11450 and later) or 7 (older
    /// builds, llama-cpp-python 0.3.36). HELLO does not tell them apart, so it is configuration.
    /// Default 8.
    pub protocol: Option<u8>,
    /// A second port serving protocol 7.0.0 beside `port` (which then serves 8.0.0), so masters of
    /// both generations can use one daemon. Default: none.
    pub port_v7: Option<u16>,
    /// Compute threads. Default: the number of physical cores.
    pub threads: Option<usize>,
    /// Numerics profile: whose arithmetic the kernels reproduce (`avx2`, `avx512`, `neon-dotprod`,
    /// `neon-i8mm`, `sve`, `portable`; see `compute::numerics`). Default: `LLAMAD_NUMERICS`, else
    /// the profile of this CPU.
    pub numerics: Option<String>,
    /// NUMA placement: `off`, `distribute` (compute threads over all nodes in turn, pages
    /// interleaved) or `isolate` (threads and pages on the node llamad starts on). Default `off`.
    pub numa: Option<String>,
    /// Devices, separated by `,` or `/`, case-insensitive. Only `CPU` exists. Default `CPU`.
    pub device: Option<String>,
    /// Enable the tensor cache (SET_TENSOR_HASH). Default false.
    pub cache: Option<bool>,
    /// Keep interleaved copies of the Q4_0/Q4_1/Q5_0/Q8_0 weight matrices graphs multiply by (faster
    /// generation, as much memory again as those matrices, from the same budget). Default true.
    pub interleave: Option<bool>,
    /// Ask for transparent huge pages for buffers of 1 MiB and more. Default false.
    pub huge_pages: Option<bool>,
    /// Memory budget for all buffers of all connections. Default: the machine's available memory.
    pub mem: Option<RawSize>,
    /// Peers allowed to connect: CIDR networks or addresses, `loopback`, `any`; a list or one
    /// comma-separated string. Default: loopback only.
    pub allow: Option<RawList>,
    /// File holding a shared secret (at least 16 bytes); when set, RPC peers must authenticate with
    /// it (llamactl can, llama.cpp masters cannot). Default: none (no authentication).
    pub secret_file: Option<PathBuf>,
}

/// A list written as a TOML array or as one comma-separated string (as environment variables give it).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum RawList {
    /// `"a,b"`.
    Text(String),
    /// `["a", "b"]`.
    Items(Vec<String>),
}

impl RawList {
    fn joined(&self) -> String {
        match self {
            RawList::Text(s) => s.clone(),
            RawList::Items(v) => v.join(","),
        }
    }
}

/// `[limits]`: bounds on what one peer may ask for.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Largest buffered request payload (GRAPH_COMPUTE). Default 1 GiB, never above the memory budget.
    pub max_frame: Option<RawSize>,
    /// Connections served at once. Default 64.
    pub max_connections: Option<usize>,
    /// Buffer bytes one connection may hold. Default: no limit beyond the memory budget.
    pub max_connection_mem: Option<RawSize>,
    /// Seconds a new connection may take to send HELLO (masters send it at once). Default 10.
    pub hello_timeout_secs: Option<u64>,
    /// Largest `n_nodes` of a graph. Default 262144.
    pub max_graph_nodes: Option<u32>,
    /// Largest `n_tensors` of a graph. Default 262144.
    pub max_graph_tensors: Option<u32>,
    /// Seconds a connection may stay silent between commands; 0 = no limit. Default 0: llama.cpp
    /// masters keep connections idle between tokens.
    pub idle_timeout_secs: Option<u64>,
    /// Seconds a peer may stay silent inside a frame (or leave a response unread); 0 = no limit.
    /// Default 60.
    pub frame_timeout_secs: Option<u64>,
}

/// `[cache]`: the tensor cache (enabled by `server.cache` or `-c`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    /// Cache root; llamad keeps its own versioned layout inside. Default: `$LLAMA_CACHE/rpc`, else the XDG
    /// cache directory + `llama.cpp/rpc` (where llama.cpp's own server keeps its cache).
    pub dir: Option<PathBuf>,
    /// Upper bound on the cache's size; least recently used unpinned objects are evicted. Default: no limit.
    pub max_size: Option<RawSize>,
    /// Re-hash (BLAKE3) every object before serving it. Default true.
    pub verify_on_read: Option<bool>,
}

/// `[tls]`: TLS on the RPC port, for llamactl masters (llama.cpp masters speak plain TCP only).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM certificate chain (the server's certificate first). Setting it (with `key`) turns TLS on.
    /// Default: none (no TLS).
    pub cert: Option<PathBuf>,
    /// PEM private key of the certificate.
    pub key: Option<PathBuf>,
    /// Refuse peers that do not speak TLS; `false` serves plain (llama.cpp) peers on the same port
    /// too. Default true (when TLS is on).
    pub require: Option<bool>,
}

/// The configuration file, every field optional.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[server]`.
    #[serde(default)]
    pub server: RawServer,
    /// `[limits]`.
    #[serde(default)]
    pub limits: RawLimits,
    /// `[cache]`.
    #[serde(default)]
    pub cache: RawCache,
    /// `[admin]`: the admin REST API.
    #[serde(default)]
    pub admin: crate::admin::RawAdmin,
    /// `[tls]`.
    #[serde(default)]
    pub tls: RawTls,
    /// `[openai]`: the OpenAI-compatible API.
    #[serde(default)]
    pub openai: crate::openai::RawOpenAi,
    /// `[[models]]`: the models the OpenAI API serves.
    #[serde(default)]
    pub models: Vec<crate::openai::RawModel>,
}

/// Command-line values; each one set overrides the file and the environment.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `-H/--host`.
    pub host: Option<String>,
    /// `-p/--port`.
    pub port: Option<u16>,
    /// `--protocol`.
    pub protocol: Option<u8>,
    /// `--port-v7`.
    pub port_v7: Option<u16>,
    /// `-t/--threads`.
    pub threads: Option<usize>,
    /// `--numerics`.
    pub numerics: Option<String>,
    /// `--numa`.
    pub numa: Option<String>,
    /// `-d/--device`.
    pub device: Option<String>,
    /// `-c/--cache`.
    pub cache: bool,
    /// `--no-interleave`.
    pub no_interleave: bool,
    /// `--mem`.
    pub mem: Option<String>,
    /// `--cache-dir`.
    pub cache_dir: Option<PathBuf>,
    /// `--cache-max-size`.
    pub cache_max_size: Option<String>,
    /// `--admin-listen` (`off` disables the admin API).
    pub admin_listen: Option<String>,
    /// `--admin-token-file`.
    pub admin_token_file: Option<PathBuf>,
    /// `--allow`.
    pub allow: Option<String>,
    /// `--secret-file`.
    pub secret_file: Option<PathBuf>,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--tls-optional` (serve plain peers too).
    pub tls_optional: bool,
    /// `--openai-listen`.
    pub openai_listen: Option<String>,
    /// `--openai-key-file`.
    pub openai_key_file: Option<PathBuf>,
    /// `--model NAME=PATH` (added to `[[models]]`).
    pub models: Vec<String>,
}

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bind host.
    pub host: String,
    /// Bind port.
    pub port: u16,
    /// The protocol version announced on `port`.
    pub protocol: &'static llamad_proto::Protocol,
    /// A second port serving 7.0.0 (only with `protocol` 8).
    pub port_v7: Option<u16>,
    /// Compute threads (≥ 1).
    pub threads: usize,
    /// The numerics profile asked for (`None`: `LLAMAD_NUMERICS`, else detection); applied once at
    /// start by `compute::numerics::init`.
    pub numerics: Option<compute::numerics::Numerics>,
    /// NUMA placement, applied once at start by `compute::numa::init`.
    pub numa: compute::numa::NumaMode,
    /// Device names, in index order.
    pub devices: Vec<String>,
    /// Tensor cache enabled.
    pub cache: bool,
    /// Interleaved weight copies for generation (see `rpc::weight_copy`).
    pub interleave: bool,
    /// Buffers on transparent huge pages (`rpc::buffer::MemoryAccount::with_huge_pages`).
    pub huge_pages: bool,
    /// Memory budget in bytes; `None` = the machine's available memory.
    pub mem: Option<u64>,
    /// Largest buffered request payload.
    pub max_frame: u64,
    /// Connections served at once.
    pub max_connections: usize,
    /// Buffer bytes one connection may hold; `None` = only the global budget.
    pub max_connection_mem: Option<u64>,
    /// Time a new connection may take to send HELLO before it is closed.
    pub hello_timeout: std::time::Duration,
    /// Peers allowed to connect to the RPC port.
    pub allow: crate::rpc::access::AllowList,
    /// The key peers must prove they know (`server.secret_file`); `None` = no authentication.
    pub auth: Option<llamad_proto::auth::AuthKey>,
    /// TLS on the RPC port (`[tls]`); `None` = plain TCP only.
    pub tls: Option<crate::rpc::tls::TlsSettings>,
    /// Silence allowed between commands; `None` = no limit.
    pub idle_timeout: Option<std::time::Duration>,
    /// Silence allowed inside a frame or while a response is unread; `None` = no limit.
    pub frame_timeout: Option<std::time::Duration>,
    /// Largest `n_nodes`.
    pub max_graph_nodes: u32,
    /// Largest `n_tensors`.
    pub max_graph_tensors: u32,
    /// Cache root; `None` = llama.cpp's default location (`cachestore::default_root`).
    pub cache_dir: Option<PathBuf>,
    /// Cache size limit in bytes; `None` = unlimited.
    pub cache_max_size: Option<u64>,
    /// Verify every cache object's BLAKE3 hash before serving it.
    pub cache_verify: bool,
    /// The admin API; `None` when disabled (and for in-process servers built from `Config::default()`).
    pub admin: Option<crate::admin::AdminConfig>,
    /// The OpenAI API; `None` when off (the default).
    pub openai: Option<crate::openai::OpenAiConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            protocol: llamad_proto::version::DEFAULT,
            port_v7: None,
            threads: physical_cores(),
            numerics: None,
            numa: compute::numa::NumaMode::Off,
            devices: vec!["CPU".into()],
            cache: false,
            interleave: true,
            huge_pages: false,
            mem: None,
            max_frame: 1 << 30,
            max_connections: 64,
            max_connection_mem: None,
            hello_timeout: std::time::Duration::from_secs(10),
            allow: crate::rpc::access::AllowList::loopback(),
            idle_timeout: None,
            auth: None,
            tls: None,
            frame_timeout: Some(std::time::Duration::from_secs(60)),
            max_graph_nodes: 1 << 18,
            max_graph_tensors: 1 << 18,
            cache_dir: None,
            cache_max_size: None,
            cache_verify: true,
            admin: None,
            openai: None,
        }
    }
}

impl Config {
    /// The listeners to bind: `(port, protocol)`, the main port first.
    pub fn listeners(&self) -> Vec<(u16, &'static llamad_proto::Protocol)> {
        let mut v = vec![(self.port, self.protocol)];
        if let Some(p) = self.port_v7 {
            v.push((p, &llamad_proto::version::V7));
        }
        v
    }

    /// The versions served, for logs and status: `"8.0.0"` or `"8.0.0 (port 50052), 7.0.0 (port 50051)"`.
    pub fn protocols_text(&self) -> String {
        match self.port_v7 {
            None => self.protocol.name(),
            Some(_) => self
                .listeners()
                .iter()
                .map(|(port, p)| format!("{p} (port {port})"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// Loads `file` (or the default path when present), applies `env` and then `flags`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Config> {
        let (text, path) = match file {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|e| Error::Config(format!("{}: {e}", p.display())))?,
                Some(p.to_path_buf()),
            ),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                let p = PathBuf::from(DEFAULT_CONFIG_PATH);
                (
                    std::fs::read_to_string(&p)
                        .map_err(|e| Error::Config(format!("{}: {e}", p.display())))?,
                    Some(p),
                )
            }
            None => (String::new(), None),
        };
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| Error::Config(with_path(&path, e)))?;
        apply_env(&mut table, env)?;
        let raw: RawConfig =
            table.try_into().map_err(|e: toml::de::Error| Error::Config(with_path(&path, e)))?;
        Config::from_raw(raw, flags)
    }

    /// Validates the merged raw values, flags last.
    pub fn from_raw(raw: RawConfig, flags: &Overrides) -> Result<Config> {
        let d = Config::default();
        let s = raw.server;
        let l = raw.limits;
        let c = raw.cache;
        let cache_max_size = match (&flags.cache_max_size, &c.max_size) {
            (Some(m), _) => Some(RawSize::Text(m.clone()).bytes("cache-max-size")?),
            (None, Some(m)) => Some(m.bytes("cache.max_size")?),
            (None, None) => None,
        };
        let host = flags.host.clone().or(s.host).unwrap_or(d.host);
        let port = flags.port.or(s.port).unwrap_or(d.port);
        if port == 0 {
            return Err(Error::Config("port: must be between 1 and 65535".into()));
        }
        let protocol = match flags.protocol.or(s.protocol) {
            None => d.protocol,
            Some(m) => llamad_proto::Protocol::by_major(m).ok_or_else(|| {
                Error::Config(format!(
                    "protocol: {m} is not a supported RPC protocol major version (8: llama.cpp b11450 and \
                     later; 7: older builds and llama-cpp-python 0.3.36)"
                ))
            })?,
        };
        let port_v7 = flags.port_v7.or(s.port_v7);
        match port_v7 {
            Some(0) => return Err(Error::Config("port_v7: must be between 1 and 65535".into())),
            Some(p) if p == port => {
                return Err(Error::Config(format!("port_v7: {p} is also the main port")));
            }
            Some(_) if protocol.version.major == 7 => {
                return Err(Error::Config(
                    "port_v7: the main port already serves protocol 7 (set protocol = 8, or drop port_v7)"
                        .into(),
                ));
            }
            _ => {}
        }
        let threads = flags.threads.or(s.threads).unwrap_or(d.threads);
        if threads == 0 {
            return Err(Error::Config("threads: must be at least 1".into()));
        }
        let numerics = match flags.numerics.as_deref().or(s.numerics.as_deref()) {
            Some(n) => Some(compute::numerics::Numerics::parse(n).ok_or_else(|| {
                Error::Config(format!(
                    "numerics: {n:?} is not avx2, avx512, neon-dotprod, neon-i8mm, sve or portable"
                ))
            })?),
            None => None,
        };
        let numa = match flags.numa.as_deref().or(s.numa.as_deref()) {
            Some(n) => compute::numa::NumaMode::parse(n)
                .ok_or_else(|| Error::Config(format!("numa: {n:?} is not off, distribute or isolate")))?,
            None => compute::numa::NumaMode::Off,
        };
        let devices = parse_devices(flags.device.as_deref().or(s.device.as_deref()).unwrap_or("CPU"))?;
        let cache = flags.cache || s.cache.unwrap_or(false);
        let interleave = !flags.no_interleave && s.interleave.unwrap_or(d.interleave);
        let huge_pages = s.huge_pages.unwrap_or(d.huge_pages);
        let mem = match (&flags.mem, &s.mem) {
            (Some(m), _) => Some(RawSize::Text(m.clone()).bytes("mem")?),
            (None, Some(m)) => Some(m.bytes("mem")?),
            (None, None) => None,
        };
        if mem == Some(0) {
            return Err(Error::Config("mem: the budget must be larger than 0".into()));
        }
        let mut max_frame = match &l.max_frame {
            Some(m) => m.bytes("max_frame")?,
            None => d.max_frame,
        };
        if let Some(m) = mem {
            max_frame = max_frame.min(m);
        }
        if max_frame < 4096 {
            return Err(Error::Config("max_frame: must be at least 4096 bytes".into()));
        }
        let max_connections = l.max_connections.unwrap_or(d.max_connections);
        if max_connections == 0 {
            return Err(Error::Config("max_connections: must be at least 1".into()));
        }
        let max_connection_mem = match &l.max_connection_mem {
            Some(m) => Some(m.bytes("max_connection_mem")?),
            None => None,
        };
        let hello_timeout = match l.hello_timeout_secs {
            Some(0) => return Err(Error::Config("hello_timeout_secs: must be at least 1".into())),
            Some(s) => std::time::Duration::from_secs(s),
            None => d.hello_timeout,
        };
        let allow = match (&flags.allow, &s.allow) {
            (Some(a), _) => crate::rpc::access::AllowList::parse(a)?,
            (None, Some(a)) => crate::rpc::access::AllowList::parse(&a.joined())?,
            (None, None) => d.allow,
        };
        let secs = |v: Option<u64>, default: Option<std::time::Duration>| match v {
            Some(0) => None,
            Some(s) => Some(std::time::Duration::from_secs(s)),
            None => default,
        };
        let auth = match flags.secret_file.as_ref().or(s.secret_file.as_ref()) {
            Some(p) => Some(load_secret(p)?),
            None => None,
        };
        let t = raw.tls;
        let tls =
            match (flags.tls_cert.as_ref().or(t.cert.as_ref()), flags.tls_key.as_ref().or(t.key.as_ref())) {
                (Some(cert), Some(key)) => {
                    let require = !flags.tls_optional && t.require.unwrap_or(true);
                    Some(crate::rpc::tls::TlsSettings::load(cert, key, require)?)
                }
                (None, None) if t.require == Some(true) => {
                    return Err(Error::Config("tls.require: needs tls.cert and tls.key".into()))
                }
                (None, None) => None,
                (Some(_), None) => {
                    return Err(Error::Config("tls.cert is set but tls.key is not (--tls-key)".into()))
                }
                (None, Some(_)) => {
                    return Err(Error::Config("tls.key is set but tls.cert is not (--tls-cert)".into()))
                }
            };
        Ok(Config {
            auth,
            tls,
            hello_timeout,
            allow,
            idle_timeout: secs(l.idle_timeout_secs, d.idle_timeout),
            frame_timeout: secs(l.frame_timeout_secs, d.frame_timeout),
            max_connection_mem,
            host,
            port,
            protocol,
            port_v7,
            threads,
            numerics,
            numa,
            devices,
            cache,
            interleave,
            huge_pages,
            mem,
            max_frame,
            max_connections,
            max_graph_nodes: l.max_graph_nodes.unwrap_or(d.max_graph_nodes),
            max_graph_tensors: l.max_graph_tensors.unwrap_or(d.max_graph_tensors),
            cache_dir: flags.cache_dir.clone().or(c.dir),
            cache_max_size,
            cache_verify: c.verify_on_read.unwrap_or(d.cache_verify),
            admin: {
                let mut a = raw.admin;
                match flags.admin_listen.as_deref() {
                    Some("off") | Some("none") => a.enabled = Some(false),
                    Some(l) => a.listen = Some(l.to_string()),
                    None => {}
                }
                if let Some(t) = &flags.admin_token_file {
                    a.token_file = Some(t.clone());
                }
                crate::admin::AdminConfig::from_raw(&a)?
            },
            openai: {
                let mut o = raw.openai;
                if let Some(l) = &flags.openai_listen {
                    o.listen = Some(l.clone());
                }
                if let Some(k) = &flags.openai_key_file {
                    o.key_file = Some(k.clone());
                }
                let mut models = raw.models;
                for m in &flags.models {
                    models.push(crate::openai::ModelConfig::parse_flag(m)?);
                }
                crate::openai::OpenAiConfig::from_raw(&o, &models, threads)?
            },
        })
    }
}

/// Reads a shared-secret file into its key.
pub fn load_secret(path: &Path) -> Result<llamad_proto::auth::AuthKey> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::Config(format!("secret_file {}: {e}", path.display())))?;
    llamad_proto::auth::AuthKey::from_secret(&bytes).ok_or_else(|| {
        Error::Config(format!(
            "secret_file {}: the secret must be at least {} bytes (e.g. `openssl rand -hex 32`)",
            path.display(),
            llamad_proto::auth::MIN_SECRET_LEN
        ))
    })
}

fn with_path(path: &Option<PathBuf>, e: impl std::fmt::Display) -> String {
    match path {
        Some(p) => format!("{}: {e}", p.display()),
        None => e.to_string(),
    }
}

/// Applies `LLAMAD__SECTION__KEY=value` variables. A value that parses as a TOML value (number,
/// boolean) is used as such, anything else as a string.
fn apply_env(table: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) -> Result<()> {
    for (k, v) in env {
        let Some(rest) = k.strip_prefix(ENV_PREFIX) else { continue };
        let Some((section, key)) = rest.split_once("__") else {
            return Err(Error::Config(format!("{k}: expected {ENV_PREFIX}SECTION__KEY")));
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or(toml::Value::String(v));
        let entry = table.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(sec) = entry else {
            return Err(Error::Config(format!("{k}: `{section}` is not a section")));
        };
        sec.insert(key, value);
    }
    Ok(())
}

/// Parses a device list (`CPU`, `cpu,CPU`, `CPU/cpu`); unknown names are an error listing the devices.
pub fn parse_devices(list: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for name in list.split([',', '/']).map(str::trim).filter(|s| !s.is_empty()) {
        let Some(known) = DEVICES.iter().find(|d| d.eq_ignore_ascii_case(name)) else {
            return Err(Error::Config(format!(
                "unknown device `{name}`; available devices: {}",
                DEVICES.join(", ")
            )));
        };
        if !out.iter().any(|d| d == known) {
            out.push((*known).to_string());
        }
    }
    if out.is_empty() {
        return Err(Error::Config(format!("no devices given; available devices: {}", DEVICES.join(", "))));
    }
    Ok(out)
}

/// Parses `1234`, `8G`, `8GB`, `8GiB`, `512M`, `1.5G` (binary units, case-insensitive).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if num.contains('.') {
        let f: f64 = num.parse().ok()?;
        let v = f * mult as f64;
        if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
            return None;
        }
        Some(v as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

/// Number of physical cores (distinct `physical id`/`core id` pairs in /proc/cpuinfo), else the
/// available parallelism.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return logical };
    let mut cores = std::collections::HashSet::new();
    let mut phys = "";
    for line in info.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        match k.trim() {
            "physical id" => phys = v.trim(),
            "core id" => {
                cores.insert((phys.to_string(), v.trim().to_string()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn protocol_versions_and_the_second_port() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("llamad.toml");
        std::fs::write(&p, "[server]\nprotocol = 7\n").unwrap();
        let none = Overrides::default();
        let d = Config::load(None, env(&[]), &none).unwrap();
        assert_eq!(d.protocol.version.major, 8, "current llama.cpp by default");
        assert_eq!((d.listeners().len(), d.protocols_text().as_str()), (1, "8.0.0"));
        let c = Config::load(Some(&p), env(&[]), &none).unwrap();
        assert_eq!(c.protocol.name(), "7.0.0");
        let c = Config::load(Some(&p), env(&[("LLAMAD__SERVER__PROTOCOL", "8")]), &none).unwrap();
        assert_eq!(c.protocol.name(), "8.0.0");
        let flags = Overrides { protocol: Some(8), port_v7: Some(50051), ..Default::default() };
        let c = Config::load(Some(&p), env(&[]), &flags).unwrap();
        let ports: Vec<(u16, String)> = c.listeners().iter().map(|(port, p)| (*port, p.name())).collect();
        assert_eq!(ports, [(50052, "8.0.0".to_string()), (50051, "7.0.0".to_string())]);
        assert_eq!(c.protocols_text(), "8.0.0 (port 50052), 7.0.0 (port 50051)");
        let err = |flags: Overrides| Config::load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(err(Overrides { protocol: Some(6), ..Default::default() }).contains("6 is not a supported"));
        assert!(err(Overrides { port_v7: Some(50052), ..Default::default() }).contains("also the main port"));
        assert!(err(Overrides { protocol: Some(7), port_v7: Some(1), ..Default::default() })
            .contains("already serves protocol 7"));
        assert!(err(Overrides { port_v7: Some(0), ..Default::default() }).contains("port_v7"));
    }

    #[test]
    fn layering_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("llamad.toml");
        std::fs::write(&p, "[server]\nport = 6000\nthreads = 3\nhost = \"0.0.0.0\"\nmem = \"2G\"\n").unwrap();
        let c = Config::load(Some(&p), env(&[]), &Overrides::default()).unwrap();
        assert_eq!((c.port, c.threads, c.host.as_str(), c.mem), (6000, 3, "0.0.0.0", Some(2 << 30)));
        let c = Config::load(
            Some(&p),
            env(&[("LLAMAD__SERVER__PORT", "7000"), ("OTHER", "x")]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!((c.port, c.threads), (7000, 3));
        assert!(!c.huge_pages, "small pages unless asked");
        let c = Config::load(Some(&p), env(&[("LLAMAD__SERVER__HUGE_PAGES", "true")]), &Overrides::default())
            .unwrap();
        assert!(c.huge_pages);
        let flags = Overrides { port: Some(8000), mem: Some("1M".into()), ..Default::default() };
        let c = Config::load(Some(&p), env(&[("LLAMAD__SERVER__PORT", "7000")]), &flags).unwrap();
        assert_eq!((c.port, c.mem, c.max_frame), (8000, Some(1 << 20), 1 << 20));
    }

    #[test]
    fn unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("llamad.toml");
        std::fs::write(&p, "[server]\nprot = 6000\n").unwrap();
        let e = Config::load(Some(&p), env(&[]), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("prot"), "{e}");
        std::fs::write(&p, "[sever]\n").unwrap();
        let e = Config::load(Some(&p), env(&[]), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("sever"), "{e}");
        std::fs::write(&p, "").unwrap();
        let e = Config::load(Some(&p), env(&[("LLAMAD__SERVER__COLOUR", "red")]), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn allow_list_layering_and_timeouts() {
        use std::net::IpAddr;
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let c = Config::from_raw(RawConfig::default(), &Overrides::default()).unwrap();
        assert!(c.allow.is_loopback_only());
        assert_eq!((c.idle_timeout, c.frame_timeout), (None, Some(std::time::Duration::from_secs(60))));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("llamad.toml");
        std::fs::write(
            &p,
            "[server]\nallow = [\"10.0.0.0/8\", \"::1\"]\n[limits]\nidle_timeout_secs = 600\nframe_timeout_secs = 0\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), env(&[]), &Overrides::default()).unwrap();
        assert!(
            c.allow.allows(ip("10.2.3.4")) && c.allow.allows(ip("::1")) && !c.allow.allows(ip("127.0.0.1"))
        );
        assert_eq!((c.idle_timeout, c.frame_timeout), (Some(std::time::Duration::from_secs(600)), None));
        let c = Config::load(
            Some(&p),
            env(&[("LLAMAD__SERVER__ALLOW", "192.168.0.0/16,127.0.0.1")]),
            &Overrides::default(),
        )
        .unwrap();
        assert!(c.allow.allows(ip("192.168.9.9")) && !c.allow.allows(ip("10.2.3.4")));
        let flags = Overrides { allow: Some("any".into()), ..Default::default() };
        let c = Config::load(Some(&p), env(&[("LLAMAD__SERVER__ALLOW", "192.168.0.0/16")]), &flags).unwrap();
        assert!(c.allow.allows(ip("8.8.8.8")));
        let bad = Overrides { allow: Some("10.0.0.0/40".into()), ..Default::default() };
        let e = Config::from_raw(RawConfig::default(), &bad).unwrap_err().to_string();
        assert!(e.contains("10.0.0.0/40"), "{e}");
    }

    #[test]
    fn devices() {
        assert_eq!(parse_devices("cpu").unwrap(), vec!["CPU"]);
        assert_eq!(parse_devices("CPU/cpu").unwrap(), vec!["CPU"]);
        let e = parse_devices("CUDA0").unwrap_err().to_string();
        assert!(e.contains("CUDA0") && e.contains("available devices: CPU"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5k"), Some(1536));
        assert_eq!(parse_size("2 TB"), Some(2 << 40));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }

    #[test]
    fn validation() {
        assert!(Config::from_raw(
            RawConfig::default(),
            &Overrides { threads: Some(0), ..Default::default() }
        )
        .is_err());
        assert!(Config::from_raw(RawConfig::default(), &Overrides { port: Some(0), ..Default::default() })
            .is_err());
        assert!(Config::from_raw(
            RawConfig::default(),
            &Overrides { mem: Some("0".into()), ..Default::default() }
        )
        .is_err());
        assert!(physical_cores() >= 1);
    }
}
