//! Reading the files a person names — configurations, certificates, tokens, policy
//! components — with a bound: a path to `/dev/zero` or a log file named by mistake must
//! end in an error, not in memory growing until the kernel kills the process. Every such
//! read in the workspace goes through [`read_at_most`].

use anyhow::{Context, bail};
use std::io::Read;
use std::path::Path;

/// The largest configuration file read: far above any policy's or scenario's (a
/// policy's default configuration may be 64 KiB).
pub const MAX_CONFIG_FILE: u64 = 16 << 20;

/// The largest component file read (`arbiter_repro::read_policy`, `policies.d/`): four times the default compile limit (16 MiB), so an
/// operator who raised that limit can still load what it allows.
pub const MAX_COMPONENT_FILE: u64 = 64 << 20;

/// The bytes of `path`, at most `max` of them; more is an error naming the file. The
/// error's root cause is the [`std::io::Error`] (`NotFound` for a missing file).
pub fn read_at_most(path: &Path, max: u64) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > max {
        bail!(
            "{} is larger than {} MiB, more than arbiter reads from one file",
            path.display(),
            max >> 20
        );
    }
    Ok(bytes)
}

/// [`read_at_most`] for a file found by scanning a directory, where nobody chose it:
/// only a regular file is opened — a FIFO named `x.wasm` would block the scan until
/// something wrote to it.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let error = arbiter_host::files::read_regular_file(dir.path(), 1 << 20).unwrap_err();
/// assert!(error.to_string().ends_with("is not a regular file"));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read_regular_file(path: &Path, max: u64) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    read_at_most(path, max)
}

/// A component file found by scanning a directory (`policies.d/`, `policy ls --dir`):
/// a regular file of at most [`MAX_COMPONENT_FILE`] bytes.
pub fn read_component_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    read_regular_file(path, MAX_COMPONENT_FILE)
}

/// Whether a read failed because the file is not there (as opposed to unreadable).
pub fn is_not_found(error: &anyhow::Error) -> bool {
    error
        .root_cause()
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
}

/// A configuration file's text (TOML), at most [`MAX_CONFIG_FILE`] bytes of UTF-8.
///
/// ```
/// let error = arbiter_host::files::read_config("/dev/zero".as_ref()).unwrap_err();
/// assert!(error.to_string().contains("larger than 16 MiB"));
/// ```
pub fn read_config(path: &Path) -> anyhow::Result<String> {
    config_from(path, read_at_most(path, MAX_CONFIG_FILE)?)
}

/// A configuration file found by scanning a directory (`policies.d/NAME.toml`): a
/// regular file of at most [`MAX_CONFIG_FILE`] bytes of UTF-8.
pub fn read_config_file(path: &Path) -> anyhow::Result<String> {
    config_from(path, read_regular_file(path, MAX_CONFIG_FILE)?)
}

fn config_from(path: &Path, bytes: Vec<u8>) -> anyhow::Result<String> {
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}
