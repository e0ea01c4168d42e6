//! Text a policy hands the host — error messages, role names, manifest fields,
//! log lines — is hostile input: it may be tens of megabytes long or carry
//! terminal escape sequences that clear an operator's screen and print a fake
//! verdict. Every such string passes through [`guest_text`] once, where it
//! enters the host, so everything downstream (the terminal, `tracing`, the
//! journal, gRPC replies) only ever sees bounded, printable text.

/// Longest error message kept from a policy (`failed(...)`, a trap's text).
pub const MAX_ERROR_TEXT: usize = 4 << 10;
/// Longest name-like field kept (a role name in an error, a version).
pub const MAX_NAME_TEXT: usize = 128;

/// `text` cut to at most `max` bytes (at a character boundary, saying how much
/// was cut) with control and bidirectional-override characters escaped as
/// `\u{…}`. Newlines and tabs are kept only when `multiline`.
///
/// ```
/// use arbiter_host::runtime::guest_text;
/// assert_eq!(guest_text("ok\x1b[2J", 64, false), "ok\\u{1b}[2J");
/// let long = "x".repeat(10_000);
/// let cut = guest_text(&long, 100, false);
/// assert!(cut.len() <= 100 && cut.ends_with("bytes cut)"));
/// ```
pub fn guest_text(text: &str, max: usize, multiline: bool) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    // Room kept for the " … (N bytes cut)" suffix.
    let budget = max.saturating_sub(40);
    for (at, c) in text.char_indices() {
        if out.len() + piece_len(c, multiline) > budget {
            // Whether the rest fits after all (counting stops at the bound,
            // so a 40 MiB string costs no more than a short one).
            let room = max.saturating_sub(out.len());
            let mut need = 0;
            let fits = text[at..].chars().all(|c| {
                need += piece_len(c, multiline);
                need <= room
            });
            if fits {
                text[at..]
                    .chars()
                    .for_each(|c| push_piece(&mut out, c, multiline));
            } else {
                out.push_str(&format!(" … ({} bytes cut)", text.len() - at));
            }
            return out;
        }
        push_piece(&mut out, c, multiline);
    }
    out
}

fn piece_len(c: char, multiline: bool) -> usize {
    if needs_escape(c, multiline) {
        // "\u{" + hex digits + "}"
        4 + format!("{:x}", c as u32).len()
    } else {
        c.len_utf8()
    }
}

fn push_piece(out: &mut String, c: char, multiline: bool) {
    if needs_escape(c, multiline) {
        out.push_str(&format!("\\u{{{:x}}}", c as u32));
    } else {
        out.push(c);
    }
}

/// Whether a guest string is printable as it is (no escapes needed), for
/// fields the host refuses rather than rewrites (a policy's name).
pub fn is_plain(text: &str) -> bool {
    !text.chars().any(|c| needs_escape(c, false))
}

fn needs_escape(c: char, multiline: bool) -> bool {
    if multiline && (c == '\n' || c == '\t') {
        return false;
    }
    c.is_control()
        // Bidirectional overrides and isolates reorder what a terminal shows
        // ("Trojan Source"); zero-width characters hide text.
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_plain_text_is_unchanged() {
        assert_eq!(guest_text("fifo 0.2 ✓", 64, false), "fifo 0.2 ✓");
        assert!(is_plain("best-fit"));
        assert!(!is_plain("best\x1b[2Jfit"));
    }

    #[test]
    fn escapes_controls_and_bidi_overrides() {
        assert_eq!(guest_text("a\nb", 64, false), "a\\u{a}b");
        assert_eq!(guest_text("a\nb\tc", 64, true), "a\nb\tc");
        assert_eq!(
            guest_text("x\u{202e}y\u{7f}", 64, false),
            "x\\u{202e}y\\u{7f}"
        );
        assert_eq!(guest_text("\r", 64, true), "\\u{d}");
    }

    #[test]
    fn long_text_is_cut_within_the_bound_at_a_char_boundary() {
        for max in [40, 100, 4096] {
            let text = "é\x1b".repeat(50_000);
            let cut = guest_text(&text, max, false);
            assert!(cut.len() <= max, "{} > {max}", cut.len());
            assert!(cut.ends_with("bytes cut)"), "{cut}");
        }
        // Exactly at the bound: nothing cut.
        let text = "y".repeat(100);
        assert_eq!(guest_text(&text, 100, false), text);
    }
}
