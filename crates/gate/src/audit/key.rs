//! The key that makes the audit chain unforgeable.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::AuditError;

type HmacSha256 = Hmac<Sha256>;

/// A secret 256-bit key for the audit chain's HMACs.
///
/// It lives in the user's state directory (`$XDG_STATE_HOME/codemode/audit.key`), readable by
/// the user only, never in a project: whoever can read it can forge log lines. The gate takes it
/// as a value; where it is kept is the caller's choice.
#[derive(Clone)]
pub struct AuditKey {
    bytes: [u8; 32],
}

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditKey(..)")
    }
}

impl AuditKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        AuditKey { bytes }
    }

    /// A fresh random key (not stored anywhere).
    pub fn generate() -> Result<Self, AuditError> {
        let mut bytes = [0u8; 32];
        let mut filled = 0;
        while filled < bytes.len() {
            let n = rustix::rand::getrandom(
                &mut bytes[filled..],
                rustix::rand::GetRandomFlags::empty(),
            )
            .map_err(|e| AuditError::Key {
                path: "(new key)".into(),
                problem: format!("no randomness for a new key: {e}"),
            })?;
            filled += n;
        }
        Ok(AuditKey { bytes })
    }

    /// `$XDG_STATE_HOME/codemode/audit.key`, else `$HOME/.local/state/codemode/audit.key`.
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/state"))
            })?;
        Some(base.join("codemode").join("audit.key"))
    }

    /// Reads a key. A key that others may read is refused: it would let them forge lines.
    pub fn load(path: &Path) -> Result<Self, AuditError> {
        let err = |problem: String| AuditError::Key {
            path: path.display().to_string(),
            problem,
        };
        let meta = std::fs::symlink_metadata(path).map_err(|e| err(e.to_string()))?;
        if !meta.file_type().is_file() {
            return Err(err("it is not a regular file".into()));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(err(format!(
                "it may be read by others (mode {:o}), who could then forge audit lines; run `chmod 600 {}`",
                meta.permissions().mode() & 0o777,
                path.display()
            )));
        }
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(err("it belongs to another user".into()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let bytes = hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| err("it is not 64 hex digits".into()))?;
        Ok(AuditKey { bytes })
    }

    /// Reads the key, or creates it (mode 0600, in a directory of mode 0700) when there is none.
    /// Two processes starting at once agree on one key: it is written to a temporary file and
    /// linked into place only if no key exists yet.
    pub fn load_or_create(path: &Path) -> Result<Self, AuditError> {
        if path.exists() {
            return Self::load(path);
        }
        let err = |problem: String| AuditError::Key {
            path: path.display().to_string(),
            problem,
        };
        let dir = path
            .parent()
            .ok_or_else(|| err("it has no parent directory".into()))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(format!("cannot create its directory: {e}")))?;
        let key = Self::generate()?;
        let temp = dir.join(format!(".audit.key.{}.tmp", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| err(format!("cannot create it: {e}")))?;
        let written = file
            .write_all(format!("{}\n", hex::encode(key.bytes)).as_bytes())
            .and_then(|_| file.sync_all());
        let linked = written.and_then(|_| std::fs::hard_link(&temp, path));
        let _ = std::fs::remove_file(&temp);
        match linked {
            Ok(()) => Ok(key),
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path),
            Err(e) => Err(err(format!("cannot create it: {e}"))),
        }
    }

    /// HMAC-SHA256 of `data`, in hex.
    pub(crate) fn mac(&self, data: &[u8]) -> String {
        // HMAC takes a key of any length, so this cannot fail; an empty MAC would never verify.
        let Ok(mut mac) = HmacSha256::new_from_slice(&self.bytes) else {
            return String::new();
        };
        mac.update(data);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Checks a hex MAC in constant time.
    pub(crate) fn verify(&self, data: &[u8], hex_mac: &str) -> bool {
        let Ok(expected) = hex::decode(hex_mac) else {
            return false;
        };
        let Ok(mut mac) = HmacSha256::new_from_slice(&self.bytes) else {
            return false;
        };
        mac.update(data);
        mac.verify_slice(&expected).is_ok()
    }
}
