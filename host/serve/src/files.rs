//! The data directory holds tenants' commands, tokens' hashes and keys:
//! it is the owner's alone (0700), its files too (0600), from the moment
//! they exist — never written world-readable and tightened afterwards.

use anyhow::Context;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and its parents) owner-only, or tightens it if it exists.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("restricting {}", dir.display()))
}

/// Writes `bytes` to `path`: owner-only when `secret`, else readable by all
/// (a CA certificate clients must be given).
pub fn write(path: &Path, bytes: &[u8], secret: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // An existing file keeps its old mode through `open`: set it.
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("restricting {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// Makes an existing file owner-only (files a library creates: the store, the journal).
pub fn restrict(path: &Path) -> anyhow::Result<()> {
    if path.exists() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_secrets_are_the_owners_alone() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "an existing directory is tightened");
        let token = dir.join("admin.token");
        std::fs::write(&token, "old").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&token, b"new", true).unwrap();
        assert_eq!(mode(&token), 0o600);
        let ca = dir.join("ca.pem");
        write(&ca, b"pem", false).unwrap();
        assert_eq!(mode(&ca), 0o644);
        let store = dir.join("arbiter.redb");
        std::fs::write(&store, "x").unwrap();
        restrict(&store).unwrap();
        assert_eq!(mode(&store), 0o600);
    }
}
