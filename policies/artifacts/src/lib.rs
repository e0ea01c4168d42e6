//! The built-in policies as Wasm components, compiled from the crates under
//! `policies/` by this crate's build script (one command builds them all:
//! building this crate).
//!
//! ```
//! let fifo = arbiter_policies::get("fifo").expect("fifo is built in");
//! assert_eq!(&fifo[..4], b"\0asm");
//!
//! // What a person types for a policy, resolved by every command the same way.
//! let named = arbiter_policies::read("builtin:fifo")?;
//! assert_eq!(named, arbiter_policies::read("fifo")?);
//! let error = arbiter_policies::read("no-such-policy").unwrap_err();
//! assert!(error.to_string().starts_with("no file `no-such-policy` and no built-in policy of that name"));
//! # Ok::<(), std::io::Error>(())
//! ```

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The component bytes of a built-in policy.
pub fn get(name: &str) -> Option<&'static [u8]> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}

/// Names of the built-in policies.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

/// The bytes of a test fixture component (see `policies/fixture-*`).
pub fn fixture(name: &str) -> Option<&'static [u8]> {
    FIXTURES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}

/// The largest component file read: four times the default compile limit (16 MiB), so an
/// operator who raised that limit can still load what it allows, and a path to
/// `/dev/zero` or a FIFO ends in an error instead of unbounded memory.
pub const MAX_COMPONENT_FILE: u64 = 64 << 20;

fn read_at_most(path: &str, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB, more than a component can be",
                max >> 20
            ),
        ));
    }
    Ok(bytes)
}

/// The prefix that names a built-in policy whatever files exist (`builtin:fifo`).
pub const BUILTIN_PREFIX: &str = "builtin:";

/// The component a person names on a command line, read the same way by every command:
/// `builtin:NAME` is that built-in; a path to a file is the file; a bare built-in name
/// with no such file is the built-in (so `./fifo`, if you wrote one, wins over ours).
/// Anything else is a `NotFound` error that lists the built-ins.
pub fn read(spec: &str) -> std::io::Result<std::borrow::Cow<'static, [u8]>> {
    use std::borrow::Cow;
    use std::io::{Error, ErrorKind};
    let built_ins = || names().collect::<Vec<_>>().join(", ");
    if let Some(name) = spec.strip_prefix(BUILTIN_PREFIX) {
        return get(name).map(Cow::Borrowed).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no built-in policy `{name}` (built-ins: {})", built_ins()),
            )
        });
    }
    match read_at_most(spec, MAX_COMPONENT_FILE) {
        Ok(bytes) => Ok(Cow::Owned(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            get(spec).map(Cow::Borrowed).ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "no file `{spec}` and no built-in policy of that name (built-ins: {})",
                        built_ins()
                    ),
                )
            })
        }
        Err(e) => Err(Error::new(e.kind(), format!("reading `{spec}`: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_wins_over_a_built_in_of_its_name_and_the_prefix_wins_over_both() {
        let dir = std::env::temp_dir().join(format!("arbiter-policies-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mine = dir.join("fifo");
        std::fs::write(&mine, b"mine").expect("write");
        let path = mine.to_str().expect("utf-8 temp path");
        assert_eq!(&super::read(path).expect("the file")[..], b"mine");
        assert_eq!(
            super::read("builtin:fifo").expect("built in"),
            super::get("fifo").expect("built in")
        );
        let error = super::read("builtin:nope").expect_err("unknown");
        assert!(
            error
                .to_string()
                .contains("no built-in policy `nope` (built-ins: ")
        );
        // Reading is bounded: `/dev/zero` is refused, not read for ever.
        let error = super::read("/dev/zero").expect_err("endless");
        assert!(error.to_string().contains("larger than 64 MiB"), "{error}");
        // A directory is neither: its read error, not a built-in's.
        let error = super::read(dir.to_str().expect("utf-8")).expect_err("a directory");
        assert!(error.to_string().starts_with("reading `"), "{error}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
