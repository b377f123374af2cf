//! Where things live on disk: the cache root, our versioned directory inside it, and the `ab/cd/<hex>` fan-out.
//!
//! ```text
//! <root>/                      $LLAMA_CACHE/rpc, shared with llama.cpp's own 16-hex-digit files (never touched)
//! <root>/llamad-v1/            everything of ours; the version changes when the layout does
//!     CACHEDIR.TAG             marks the directory as a cache for backup tools
//!     index.redb               the index (rebuildable from the objects)
//!     objects/ab/cd/<64 hex>   one immutable file (mode 0444) per object, named by its BLAKE3 digest
//!     tmp/                     temp files of writes in progress; anything here at open time is garbage
//!     quarantine/              hand-added files whose name does not match their content
//! ```

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::digest::Digest;
use crate::error::{Error, Result};

/// Name of our versioned directory inside the cache root.
pub const LAYOUT_DIR: &str = "llamad-v1";

const CACHEDIR_TAG: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by llamad (cachestore).\n\
# For information about cache directory tags see https://bford.info/cachedir/\n";

/// The cache root llama.cpp's RPC server would use, or an error when there is no home directory.
///
/// `$LLAMA_CACHE/rpc` when `LLAMA_CACHE` is set and non-empty (used as is, no `llama.cpp` suffix);
/// otherwise the platform cache directory + `llama.cpp/rpc`: `$XDG_CACHE_HOME` or `$HOME/.cache` on Linux,
/// `$HOME/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows (ref: ggml-rpc-protocol.md §9).
pub fn try_default_root() -> Result<PathBuf> {
    match std::env::var_os("LLAMA_CACHE") {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v).join("rpc")),
        _ => dirs::cache_dir().map(|d| d.join("llama.cpp").join("rpc")).ok_or(Error::NoCacheDir),
    }
}

/// Like [`try_default_root`], falling back to the relative path `llama.cpp/rpc` when no home directory exists.
pub fn default_root() -> PathBuf {
    try_default_root().unwrap_or_else(|_| PathBuf::from("llama.cpp").join("rpc"))
}

/// The resolved paths of one store.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cache root given to `Store::open`.
    pub root: PathBuf,
    /// `<root>/llamad-v1`.
    pub base: PathBuf,
    /// `<base>/objects`.
    pub objects: PathBuf,
    /// `<base>/tmp`.
    pub tmp: PathBuf,
    /// `<base>/quarantine`.
    pub quarantine: PathBuf,
    /// `<base>/index.redb`.
    pub index: PathBuf,
}

impl Layout {
    /// Computes the paths under `root` (nothing is created).
    pub fn new(root: &Path) -> Layout {
        let base = root.join(LAYOUT_DIR);
        Layout {
            root: root.to_path_buf(),
            objects: base.join("objects"),
            tmp: base.join("tmp"),
            quarantine: base.join("quarantine"),
            index: base.join("index.redb"),
            base,
        }
    }

    /// Creates the directories and the cache tag if missing.
    pub fn create(&self) -> Result<()> {
        for dir in [&self.root, &self.base, &self.objects, &self.tmp, &self.quarantine] {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("create dir", dir, e))?;
        }
        let tag = self.base.join("CACHEDIR.TAG");
        if !tag.exists() {
            std::fs::write(&tag, CACHEDIR_TAG).map_err(|e| Error::io("write", &tag, e))?;
        }
        Ok(())
    }

    /// `objects/ab/cd`: the directory holding the object.
    pub fn object_dir(&self, digest: &Digest) -> PathBuf {
        let hex = digest.to_hex();
        self.objects.join(&hex[0..2]).join(&hex[2..4])
    }

    /// `objects/ab/cd/<64 hex>`.
    pub fn object_path(&self, digest: &Digest) -> PathBuf {
        self.object_dir(digest).join(digest.to_hex())
    }

    /// The digest a file name claims (64 lower-case hex digits), if any.
    pub fn parse_object_name(name: &OsStr) -> Option<Digest> {
        let s = name.to_str()?;
        if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        s.parse().ok()
    }

    /// True when `path` is a location strictly inside `objects/` (at any depth) made only of normal
    /// components, so that `..` cannot lead outside.
    pub fn is_under_objects(&self, path: &Path) -> bool {
        match path.strip_prefix(&self.objects) {
            Ok(rest) => {
                rest.components().next().is_some()
                    && rest.components().all(|c| matches!(c, std::path::Component::Normal(_)))
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_out_uses_first_two_bytes() {
        let l = Layout::new(Path::new("/c"));
        let d = Digest::of(b"");
        assert_eq!(
            l.object_path(&d),
            Path::new(
                "/c/llamad-v1/objects/af/13/af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
            )
        );
    }

    #[test]
    fn parse_object_name_rejects_llama_cpp_names() {
        assert!(Layout::parse_object_name(OsStr::new("9ebd4ca7a79e5ddd")).is_none());
        let d = Digest::of(b"x");
        assert_eq!(Layout::parse_object_name(OsStr::new(&d.to_hex())), Some(d));
        assert!(Layout::parse_object_name(OsStr::new(&d.to_hex().to_uppercase())).is_none());
    }

    #[test]
    fn under_objects_rejects_escapes() {
        let l = Layout::new(Path::new("/c"));
        assert!(l.is_under_objects(Path::new("/c/llamad-v1/objects/ab/x")));
        assert!(!l.is_under_objects(Path::new("/c/llamad-v1/objects")));
        assert!(!l.is_under_objects(Path::new("/c/llamad-v1/objects/../index.redb")));
        assert!(!l.is_under_objects(Path::new("/c/llamad-v1/tmp/x")));
    }
}
