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
    /// The serving generation's configuration, on the first round it serves
    /// after a rebuild or another generation (absent otherwise, and in
    /// journals written before this field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
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
        Journal::from_reader(BufReader::new(file))
            .with_context(|| format!("reading {}", path.display()))
    }

    /// Reads journal lines from `source`: records in order, and the lines
    /// that are not records (a torn last line, a line that is not UTF-8)
    /// set aside with their line number and the reason. Only an I/O error
    /// stops the reading.
    pub fn from_reader(mut source: impl BufRead) -> anyhow::Result<Journal> {
        let mut journal = Journal::default();
        let mut bytes = Vec::new();
        let mut number = 0usize;
        loop {
            bytes.clear();
            let read = source
                .read_until(b'\n', &mut bytes)
                .with_context(|| format!("reading line {}", number + 1))?;
            if read == 0 {
                break;
            }
            number += 1;
            let line = match std::str::from_utf8(&bytes) {
                Ok(line) => line,
                Err(e) => {
                    journal.skipped.push((
                        number,
                        format!("not UTF-8 (invalid byte at column {})", e.valid_up_to() + 1),
                    ));
                    continue;
                }
            };
            let i = number - 1;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Record>(line) {
                Ok(Record::Snapshot {
                    cell,
                    wall_ms,
                    mut snapshot,
                }) => {
                    // A journal from before contract 0.2 lacks its columns.
                    snapshot.fill_absent_columns();
                    journal.records.push(Record::Snapshot {
                        cell,
                        wall_ms,
                        snapshot,
                    });
                }
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

    /// Found reading the journal path for its fuzz target: a snapshot whose job columns have
    /// unequal lengths panicked while its progress columns were filled in.
    #[test]
    fn a_ragged_snapshot_is_refused_not_a_panic() -> anyhow::Result<()> {
        let mut snapshot = Snapshot::default();
        snapshot.jobs.name = vec![0, 1];
        let line = serde_json::to_string(&Record::Snapshot {
            cell: "control".into(),
            wall_ms: 0,
            snapshot: Box::new(snapshot),
        })?;
        let journal = Journal::from_reader(line.as_bytes())?;
        assert_eq!(journal.records.len(), 1);
        let refused = crate::replay::scenario(&journal, "control").map(drop);
        let e = refused.expect_err("a ragged snapshot builds no mirror");
        assert!(format!("{e:#}").contains("different lengths"), "{e:#}");
        Ok(())
    }

    #[test]
    fn a_line_that_is_not_utf8_is_skipped_with_its_number() -> anyhow::Result<()> {
        let mut text = Vec::new();
        text.extend_from_slice(b"{\"not\": \"a record\"}\n");
        text.extend_from_slice(b"\xff\xfe broken\n");
        let j = Journal::from_reader(std::io::Cursor::new(text))?;
        assert_eq!(j.skipped.len(), 2, "{:?}", j.skipped);
        assert_eq!(j.skipped[1].0, 2);
        assert!(j.skipped[1].1.contains("UTF-8"), "{:?}", j.skipped);
        Ok(())
    }

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
            config: Some("seed = 7\n".into()),
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

    /// A journal a 0.1 host wrote (no speeds, no progress columns, bare
    /// model ids) still reads, and its snapshot still builds a mirror.
    #[test]
    fn reads_a_journal_written_before_contract_0_2() -> anyhow::Result<()> {
        use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
        let mut state = ClusterState::new();
        state.add_node(NodeRequest::gpus("n0", "default", "V100", 32_768, 2))?;
        let (delta, _) = state.begin_round(10);
        state.submit(JobRequest::gpus("j", "t", 1, 1))?;
        let snapshot = Record::Snapshot {
            cell: "control".into(),
            wall_ms: 1,
            snapshot: Box::new(state.snapshot()),
        };
        let mut old_snapshot = serde_json::to_value(&snapshot)?;
        let s = &mut old_snapshot["snapshot"];
        s.as_object_mut().map(|o| o.remove("gpu_model_speed"));
        for column in [
            "started_ms",
            "attained_ms",
            "remaining_ms",
            "remaining_workers",
            "reported_ms",
        ] {
            s["jobs"].as_object_mut().map(|o| o.remove(column));
        }
        let mut old_round = serde_json::to_value(Record::Round(Box::new(RoundRecord {
            cell: "control".into(),
            delta: (*delta).clone(),
            round: RoundInfo::default(),
            served: "active".into(),
            slot: "default".into(),
            generation: None,
            digest: String::new(),
            decisions: Vec::new(),
            faults: Vec::new(),
            fuel: None,
            latency_us: 0,
            policy_us: 0,
            config: None,
        })))?;
        let events = old_round["delta"]["events"]
            .as_array_mut()
            .ok_or_else(|| anyhow::anyhow!("no events"))?;
        let models = events
            .iter_mut()
            .find_map(|e| e.get_mut("GpuModelsAdded"))
            .ok_or_else(|| anyhow::anyhow!("no GpuModelsAdded in the round"))?;
        *models = serde_json::json!([models[0][0]]);

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("old.jsonl");
        std::fs::write(&path, format!("{old_snapshot}\n{old_round}\n"))?;
        let j = Journal::read(&path)?;
        assert!(j.skipped.is_empty(), "{:?}", j.skipped);
        let Record::Snapshot { snapshot: read, .. } = &j.records[0] else {
            anyhow::bail!("first record is not the snapshot");
        };
        assert_eq!(**read, state.snapshot(), "filled as a 0.2 host starts");
        let Record::Round(round) = &j.records[1] else {
            anyhow::bail!("second record is not the round");
        };
        assert!(round.delta.events.iter().any(|e| matches!(
            e,
            arbiter_policy_sdk::model::Event::GpuModelsAdded(m) if m[0].1 == 1000
        )));
        Ok(())
    }
}
