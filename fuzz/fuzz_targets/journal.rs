//! The decision-journal reader, and what `arbiter replay` derives from a
//! journal, on arbitrary bytes: a journal is a file on disk that a crash can
//! tear and anyone with access can edit, so a bad one is an error, never a
//! panic.
#![no_main]

use arbiter_serve::journal::Journal;
use arbiter_serve::replay;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(journal) = Journal::from_reader(data) else {
        return;
    };
    for cell in journal.cells() {
        let _ = replay::scenario(&journal, &cell);
        if let Some(digest) = replay::main_digest(&journal, &cell) {
            let _ = replay::journaled_config(&journal, &cell, &digest);
        }
    }
});
