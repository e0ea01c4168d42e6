//! Finding the shared traces folder.

use std::env;
use std::path::{Path, PathBuf};

use crate::error::{Result, TraceError};

/// Environment variable that names the traces folder explicitly.
pub const TRACES_DIR_ENV: &str = "ARBITER_TRACES";

/// Where the traces live relative to a directory that holds the checkout: the repository
/// is at `<x>/main` and the traces at `<x>/shared/traces`.
const SHARED_TRACES: &str = "shared/traces";

/// Finds the shared traces folder.
///
/// 1. `ARBITER_TRACES`, if set (an error if it does not name a directory: an explicit
///    setting that is wrong should not silently fall back to another copy).
/// 2. Otherwise `shared/traces` under the current directory, the `CARGO_MANIFEST_DIR` of
///    the running build, or this crate's own source directory (each also with symlinks
///    resolved), or under any of their ancestors; the first that is a directory wins. This finds `<x>/shared/traces` for a
///    checkout at `<x>/main` wherever `<x>` is.
pub fn traces_dir() -> Result<PathBuf> {
    if let Some(explicit) = env::var_os(TRACES_DIR_ENV) {
        let explicit = PathBuf::from(explicit);
        if explicit.is_dir() {
            return Ok(explicit);
        }
        return Err(TraceError::TracesDirNotFound {
            reason: format!("{TRACES_DIR_ENV} is set but is not a directory"),
            searched: vec![explicit],
        });
    }
    let mut starts: Vec<PathBuf> = Vec::new();
    if let Ok(current) = env::current_dir() {
        starts.push(current);
    }
    if let Some(manifest) = env::var_os("CARGO_MANIFEST_DIR") {
        starts.push(PathBuf::from(manifest));
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    // A checkout reached through a symlink has its `shared/` beside the real directory,
    // so search from the resolved paths as well.
    let resolved: Vec<PathBuf> = starts
        .iter()
        .filter_map(|start| start.canonicalize().ok())
        .filter(|real| !starts.contains(real))
        .collect();
    starts.extend(resolved);
    find_shared_traces(&starts)
}

/// The path of `relative` (e.g. [`crate::philly::JOBS_FILE`]) inside [`traces_dir`],
/// checked to exist so a missing file is reported by name rather than as a bare I/O error.
pub fn trace_file(relative: &str) -> Result<PathBuf> {
    let path = traces_dir()?.join(relative);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TraceError::TracesDirNotFound {
            reason: format!("the traces folder has no file `{relative}`"),
            searched: vec![path],
        })
    }
}

fn find_shared_traces(starts: &[PathBuf]) -> Result<PathBuf> {
    find_shared_traces_below(starts, None)
}

/// Like [`find_shared_traces`], but never looks above `boundary` (tests run
/// in temporary directories whose real ancestors may hold a `shared/traces`).
fn find_shared_traces_below(starts: &[PathBuf], boundary: Option<&Path>) -> Result<PathBuf> {
    let mut searched = Vec::new();
    for start in starts {
        let within = |a: &&Path| boundary.is_none_or(|b| a.starts_with(b));
        for ancestor in start.ancestors().take_while(within) {
            let candidate = ancestor.join(SHARED_TRACES);
            if candidate.is_dir() {
                return Ok(candidate);
            }
            if !searched.contains(&candidate) {
                searched.push(candidate);
            }
        }
    }
    Err(TraceError::TracesDirNotFound {
        reason: format!("no `{SHARED_TRACES}` beside any ancestor of the search starts"),
        searched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_shared_traces_beside_a_checkout() {
        let root = tempfile::tempdir().unwrap();
        let traces = root.path().join("shared/traces");
        let crate_dir = root.path().join("main/host/traces");
        std::fs::create_dir_all(&traces).unwrap();
        std::fs::create_dir_all(&crate_dir).unwrap();
        assert_eq!(find_shared_traces(&[crate_dir]).unwrap(), traces);
    }

    #[test]
    fn reports_every_place_searched() {
        let root = tempfile::tempdir().unwrap();
        let start = root.path().join("a/b");
        std::fs::create_dir_all(&start).unwrap();
        let error =
            find_shared_traces_below(std::slice::from_ref(&start), Some(root.path())).unwrap_err();
        let TraceError::TracesDirNotFound { searched, .. } = &error else {
            panic!("unexpected error {error}");
        };
        assert!(searched.contains(&start.join("shared/traces")));
        assert!(searched.contains(&root.path().join("shared/traces")));
        assert!(error.to_string().contains("ARBITER_TRACES"));
    }
}
