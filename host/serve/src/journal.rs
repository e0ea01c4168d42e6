//! The decision journal: an append-only file of JSON lines, one per round.
//!
//! A cell writes a [`Record::Snapshot`] whenever it is (re)built and a
//! [`Record::Round`] after every round: the delta the round closed, the round
//! info, who served it (generation and digest), the decisions applied, fuel
//! and latency. That is exactly what a policy saw and said, so
//! [`crate::replay`] can feed the same inputs to the same component and
//! compare its answers bit for bit, or rebuild the workload for a
//! counterfactual run under another policy.
//!
//! Each record is written with one `write` call, so a `kill -9` leaves at
//! most a torn last line, which the reader reports and skips.

use anyhow::Context;
use arbiter_policy_sdk::model::{Decision, Delta, RoundInfo, Snapshot};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// One line of the journal.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// The full state a cell starts from (at start-up and after every rebuild).
    Snapshot {
        cell: String,
        wall_ms: u64,
        snapshot: Box<Snapshot>,
    },
    /// One round.
    Round(Box<RoundRecord>),
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RoundRecord {
    pub cell: String,
    /// Everything that changed since the cell's previous record.
    pub delta: Delta,
    pub round: RoundInfo,
    /// "active", "fallback", "native" or "nobody".
    pub served: String,
    pub slot: String,
    pub generation: Option<u64>,
    /// sha256 of the component that answered; empty for the native policy.
    pub digest: String,
    pub decisions: Vec<Decision>,
    pub faults: Vec<String>,
    pub fuel: Option<u64>,
    pub latency_us: u64,
    pub policy_us: u64,
}

/// Appends records.
pub struct JournalWriter {
    path: PathBuf,
    file: File,
    line: Vec<u8>,
}

impl JournalWriter {
    pub fn open(path: &Path) -> anyhow::Result<JournalWriter> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening journal {}", path.display()))?;
        Ok(JournalWriter {
            path: path.to_path_buf(),
            file,
            line: Vec::with_capacity(4096),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn append(&mut self, record: &Record) -> anyhow::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record).context("encoding a journal record")?;
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .with_context(|| format!("appending to {}", self.path.display()))
    }
}

/// What reading a journal found.
#[derive(Debug, Default)]
pub struct Journal {
    pub records: Vec<Record>,
    /// Lines that did not parse (a torn last line after a crash), by line number.
    pub skipped: Vec<(usize, String)>,
}

impl Journal {
    pub fn read(path: &Path) -> anyhow::Result<Journal> {
        let file =
            File::open(path).with_context(|| format!("opening journal {}", path.display()))?;
        let mut journal = Journal::default();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Record>(&line) {
                Ok(r) => journal.records.push(r),
                Err(e) => journal.skipped.push((i + 1, e.to_string())),
            }
        }
        Ok(journal)
    }

    /// Names of the cells that appear, in order of first appearance.
    pub fn cells(&self) -> Vec<String> {
        let mut cells: Vec<String> = Vec::new();
        for r in &self.records {
            let c = match r {
                Record::Snapshot { cell, .. } => cell,
                Record::Round(r) => &r.cell,
            };
            if !cells.contains(c) {
                cells.push(c.clone());
            }
        }
        cells
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_skips_a_torn_line() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("j.jsonl");
        let mut w = JournalWriter::open(&path)?;
        let rec = Record::Round(Box::new(RoundRecord {
            cell: "control".into(),
            delta: Delta {
                base_epoch: 1,
                epoch: 2,
                now_ms: 5,
                events: Vec::new(),
            },
            round: RoundInfo {
                epoch: 2,
                now_ms: 5,
                max_decisions: 10,
            },
            served: "active".into(),
            slot: "default".into(),
            generation: Some(1),
            digest: "ab".into(),
            decisions: vec![Decision::Preempt(3)],
            faults: Vec::new(),
            fuel: None,
            latency_us: 10,
            policy_us: 5,
        }));
        w.append(&rec)?;
        drop(w);
        let mut f = OpenOptions::new().append(true).open(&path)?;
        f.write_all(b"{\"kind\":\"round\",\"cel")?;
        let j = Journal::read(&path)?;
        assert_eq!(j.records, vec![rec]);
        assert_eq!(j.skipped.len(), 1);
        assert_eq!(j.cells(), vec!["control".to_string()]);
        Ok(())
    }
}
