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
//!
//! **Bounded.** The journal is a series of segments: `journal.jsonl` is the
//! one being written; past `segment_bytes` it is sealed as
//! `journal.<n>.jsonl` and a fresh one begins with a *checkpoint* of every
//! cell (so a reading can start at any segment), and sealed segments are
//! deleted oldest first while the journal is over `max_bytes`. Snapshots
//! and checkpoints are stored **by reference**: the state once, in
//! `journal-snapshots/<sha256>.json`, the line naming it — a restart that
//! rebuilds identical cells adds a line, not another copy. A snapshot file
//! goes when no remaining segment names it. [`Journal::read`] reads every
//! segment in order and resolves the references.

use anyhow::Context;
use arbiter_policy_sdk::model::{Decision, Delta, RoundInfo, Snapshot};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
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
    /// A cell's state where a segment begins, written at rotation so the
    /// segment can be read on its own. A reader that already follows the
    /// cell ignores it (the live policy did not restart there).
    Checkpoint {
        cell: String,
        wall_ms: u64,
        snapshot: Box<Snapshot>,
    },
    /// On disk only: a snapshot or checkpoint stored by reference
    /// (`journal-snapshots/<snapshot>.json`); [`Journal::read`] resolves it.
    SnapshotRef {
        cell: String,
        wall_ms: u64,
        snapshot: String,
        #[serde(default)]
        checkpoint: bool,
    },
}

impl Record {
    /// The cell a record is about.
    pub fn cell(&self) -> &str {
        match self {
            Record::Snapshot { cell, .. }
            | Record::Checkpoint { cell, .. }
            | Record::SnapshotRef { cell, .. } => cell,
            Record::Round(r) => &r.cell,
        }
    }
}

/// Where the segments of the journal whose active file is `path` live.
fn sealed_segments(path: &Path) -> Vec<(u64, PathBuf)> {
    let (Some(dir), Some(stem)) = (path.parent(), path.file_stem().and_then(|s| s.to_str())) else {
        return Vec::new();
    };
    let prefix = format!("{stem}.");
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name
                .strip_prefix(&prefix)?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .collect();
    out.sort();
    out
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// What the journal whose active segment is `path` takes on disk: every
/// segment and every stored snapshot.
pub fn disk_bytes(path: &Path) -> u64 {
    let segments: u64 = sealed_segments(path)
        .iter()
        .map(|(_, p)| file_bytes(p))
        .sum();
    let snapshots: u64 = std::fs::read_dir(snapshot_dir(path))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| file_bytes(&e.path()))
        .sum();
    segments + file_bytes(path) + snapshots
}

/// The directory of snapshots stored by reference, beside the journal.
fn snapshot_dir(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("journal");
    path.with_file_name(format!("{stem}-snapshots"))
}

/// How big segments grow and how big the journal may get.
#[derive(Clone, Copy, Debug)]
pub struct JournalLimits {
    pub segment_bytes: u64,
    pub max_bytes: u64,
}

impl Default for JournalLimits {
    fn default() -> Self {
        JournalLimits {
            segment_bytes: 64 << 20,
            max_bytes: 1 << 30,
        }
    }
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
    /// Fuel the answering policy's calls consumed (sync and schedule), when the
    /// plane meters fuel (`arbiter serve --fuel`): the round's cost in the
    /// guest's own instructions, the same on any machine.
    pub fuel: Option<u64>,
    pub latency_us: u64,
    pub policy_us: u64,
    /// The serving generation's configuration, on the first round it serves
    /// after a rebuild or another generation (absent otherwise, and in
    /// journals written before this field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

/// What the round thread asks of the journal thread.
enum Command {
    Append(Box<Record>),
    Rotate(std::sync::mpsc::Sender<anyhow::Result<()>>),
    Flush(std::sync::mpsc::Sender<()>),
}

/// Appends records. Encoding and writing happen on a thread of their own:
/// a round pays for handing its record over, not for JSON and a `write`
/// (about 60 µs, as much as a whole best-fit round). Records are written
/// in the order given; dropping the writer writes what is queued.
pub struct JournalWriter {
    path: PathBuf,
    tx: Option<std::sync::mpsc::Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Bytes in the active segment, as the thread last wrote.
    bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Set once a write failed: journaling has stopped.
    failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    limits: JournalLimits,
}

impl JournalWriter {
    pub fn open(path: &Path) -> anyhow::Result<JournalWriter> {
        JournalWriter::open_with(path, JournalLimits::default())
    }

    pub fn open_with(path: &Path, limits: JournalLimits) -> anyhow::Result<JournalWriter> {
        use std::sync::atomic::Ordering;
        let mut segments = SegmentWriter::open_with(path, limits)?;
        let bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(segments.bytes));
        let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<Command>();
        let thread = {
            let (bytes, failed) = (bytes.clone(), failed.clone());
            std::thread::Builder::new()
                .name("arbiter-journal".into())
                .spawn(move || {
                    for command in rx {
                        match command {
                            Command::Append(record) => {
                                if failed.load(Ordering::Acquire) {
                                    continue;
                                }
                                if let Err(e) = segments.append(&record) {
                                    tracing::error!(error = %format!("{e:#}"), "journal write failed; journaling stops");
                                    failed.store(true, Ordering::Release);
                                }
                                bytes.store(segments.bytes, Ordering::Release);
                            }
                            Command::Rotate(reply) => {
                                let done = segments.rotate();
                                bytes.store(segments.bytes, Ordering::Release);
                                let _ = reply.send(done);
                            }
                            Command::Flush(reply) => {
                                let _ = reply.send(());
                            }
                        }
                    }
                })
                .context("starting the journal thread")?
        };
        Ok(JournalWriter {
            path: path.to_path_buf(),
            tx: Some(tx),
            thread: Some(thread),
            bytes,
            failed,
            limits,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&self, command: Command) -> anyhow::Result<()> {
        if self.failed.load(std::sync::atomic::Ordering::Acquire) {
            anyhow::bail!("an earlier journal write failed");
        }
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(command).ok())
            .ok_or_else(|| anyhow::anyhow!("the journal thread stopped"))
    }

    /// Queues a record (a snapshot or checkpoint goes by reference).
    pub fn append(&mut self, record: Record) -> anyhow::Result<()> {
        self.send(Command::Append(Box::new(record)))
    }

    /// Waits until everything queued is written.
    pub fn flush(&self) -> anyhow::Result<()> {
        let (reply, done) = std::sync::mpsc::channel();
        self.send(Command::Flush(reply))?;
        done.recv().context("the journal thread stopped")
    }

    /// Whether the active segment is full: the plane then calls [`JournalWriter::rotate`]
    /// and writes a checkpoint of every cell into the new segment.
    pub fn is_full(&self) -> bool {
        self.bytes.load(std::sync::atomic::Ordering::Acquire) >= self.limits.segment_bytes
    }

    /// Seals the active segment and starts a new one (after what is queued),
    /// deleting the oldest sealed segments while the journal is over its limit.
    pub fn rotate(&mut self) -> anyhow::Result<()> {
        let (reply, done) = std::sync::mpsc::channel();
        self.send(Command::Rotate(reply))?;
        done.recv().context("the journal thread stopped")?
    }
}

impl Drop for JournalWriter {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has written the queue.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The journal's files: appends, seals, deletes. Owned by the journal thread.
struct SegmentWriter {
    path: PathBuf,
    file: File,
    line: Vec<u8>,
    /// Bytes in the active segment.
    bytes: u64,
    limits: JournalLimits,
}

impl SegmentWriter {
    fn open_with(path: &Path, limits: JournalLimits) -> anyhow::Result<SegmentWriter> {
        let mut file = open_private_append(path)?;
        let bytes = end_torn_record(&mut file, path)?;
        Ok(SegmentWriter {
            path: path.to_path_buf(),
            file,
            line: Vec::with_capacity(4096),
            bytes,
            limits,
        })
    }

    /// Appends a record; a snapshot or checkpoint goes by reference.
    fn append(&mut self, record: &Record) -> anyhow::Result<()> {
        let by_reference = match record {
            Record::Snapshot {
                cell,
                wall_ms,
                snapshot,
            } => Some((cell, *wall_ms, snapshot, false)),
            Record::Checkpoint {
                cell,
                wall_ms,
                snapshot,
            } => Some((cell, *wall_ms, snapshot, true)),
            _ => None,
        };
        self.line.clear();
        match by_reference {
            Some((cell, wall_ms, snapshot, checkpoint)) => {
                let digest = self.store_snapshot(snapshot)?;
                serde_json::to_writer(
                    &mut self.line,
                    &Record::SnapshotRef {
                        cell: cell.clone(),
                        wall_ms,
                        snapshot: digest,
                        checkpoint,
                    },
                )
            }
            None => serde_json::to_writer(&mut self.line, record),
        }
        .context("encoding a journal record")?;
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .with_context(|| format!("appending to {}", self.path.display()))?;
        self.bytes += self.line.len() as u64;
        Ok(())
    }

    /// Writes a snapshot's file once (content-addressed); returns its name.
    fn store_snapshot(&self, snapshot: &Snapshot) -> anyhow::Result<String> {
        let bytes = serde_json::to_vec(snapshot).context("encoding a snapshot")?;
        let digest = crate::plane::sha256_hex(&bytes);
        let dir = snapshot_dir(&self.path);
        crate::files::private_dir(&dir)?;
        let file = dir.join(format!("{digest}.json"));
        if !file.exists() {
            // Written whole, then renamed: a crash never leaves half a snapshot under its name.
            let partial = dir.join(format!("{digest}.partial"));
            crate::files::write(&partial, &bytes, true)?;
            std::fs::rename(&partial, &file)
                .with_context(|| format!("storing {}", file.display()))?;
        }
        Ok(digest)
    }

    /// Seals the active segment, starts a new one, and deletes the oldest
    /// sealed segments (and the snapshots only they named) while the journal
    /// is over its limit.
    fn rotate(&mut self) -> anyhow::Result<()> {
        self.file.sync_data().ok();
        let next = sealed_segments(&self.path).last().map_or(1, |(n, _)| n + 1);
        let stem = self
            .path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("journal");
        let sealed = self.path.with_file_name(format!("{stem}.{next:06}.jsonl"));
        std::fs::rename(&self.path, &sealed)
            .with_context(|| format!("sealing {}", self.path.display()))?;
        self.file = open_private_append(&self.path)?;
        self.bytes = 0;
        self.enforce_limit()
    }

    fn enforce_limit(&self) -> anyhow::Result<()> {
        let mut segments = sealed_segments(&self.path);
        let mut total = disk_bytes(&self.path);
        let mut removed = false;
        while !segments.is_empty() && total > self.limits.max_bytes {
            let (_, oldest) = segments.remove(0);
            total = total.saturating_sub(file_bytes(&oldest));
            std::fs::remove_file(&oldest)
                .with_context(|| format!("removing {}", oldest.display()))?;
            tracing::info!(segment = %oldest.display(), "journal over its limit: oldest segment removed");
            removed = true;
        }
        if removed {
            self.collect_snapshots(&segments)?;
        }
        Ok(())
    }

    /// Deletes snapshot files no remaining segment names.
    fn collect_snapshots(&self, segments: &[(u64, PathBuf)]) -> anyhow::Result<()> {
        let mut named = std::collections::HashSet::new();
        for path in segments
            .iter()
            .map(|(_, p)| p.clone())
            .chain([self.path.clone()])
        {
            let Ok(file) = File::open(&path) else {
                continue;
            };
            for line in BufReader::new(file).split(b'\n').map_while(Result::ok) {
                if let Ok(Record::SnapshotRef { snapshot, .. }) = serde_json::from_slice(&line) {
                    named.insert(snapshot);
                }
            }
        }
        for entry in std::fs::read_dir(snapshot_dir(&self.path))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let digest = name.trim_end_matches(".json");
            if name.ends_with(".json") && !named.contains(digest) {
                std::fs::remove_file(entry.path()).ok();
            }
        }
        Ok(())
    }
}

/// A journal whose last record was cut short (the host died mid-write) gets the newline
/// that record lacks, so the first record of this run starts a line of its own: appended
/// onto the torn one, it would have been skipped with it. The torn line stays, and readers
/// report it as skipped. Returns the file's length after.
fn end_torn_record(file: &mut File, path: &Path) -> anyhow::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let len = file.metadata().map_or(0, |m| m.len());
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    File::open(path)
        .and_then(|mut f| {
            f.seek(SeekFrom::End(-1))?;
            f.read_exact(&mut last)
        })
        .with_context(|| format!("reading the end of journal {}", path.display()))?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    tracing::warn!(
        journal = %path.display(),
        "the journal ends inside a record (the host stopped mid-write); that record is kept \
         as a line of its own, which readers skip"
    );
    file.write_all(b"\n")
        .with_context(|| format!("ending the torn record of {}", path.display()))?;
    Ok(len + 1)
}

/// Opens a journal file for appending, owner-only.
fn open_private_append(path: &Path) -> anyhow::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening journal {}", path.display()))
}

/// The longest journal line read: far above any record the plane writes (snapshots are
/// files of their own; a round's record holds at most a round's decisions), so that a file
/// that is not a journal costs a bounded buffer, not memory without end.
pub const MAX_LINE_BYTES: u64 = 256 << 20;

/// Reads past the rest of a line without keeping it.
fn skip_line(source: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buffer = source.fill_buf()?;
        if buffer.is_empty() {
            return Ok(());
        }
        match buffer.iter().position(|&b| b == b'\n') {
            Some(end) => {
                source.consume(end + 1);
                return Ok(());
            }
            None => {
                let all = buffer.len();
                source.consume(all);
            }
        }
    }
}

/// What reading a journal found.
#[derive(Debug, Default)]
pub struct Journal {
    pub records: Vec<Record>,
    /// Lines that did not parse (a torn last line after a crash), by line number.
    pub skipped: Vec<(usize, String)>,
    /// Lines read.
    pub lines: usize,
    /// The line of each snapshot reference read, in order: a snapshot file that cannot be
    /// read sets its line aside.
    pub(crate) ref_lines: Vec<usize>,
}

impl Journal {
    /// Reads the journal whose active segment is `path`: its sealed
    /// segments in order, then `path`, with snapshots resolved from
    /// `journal-snapshots/` (line numbers count across segments).
    pub fn read(path: &Path) -> anyhow::Result<Journal> {
        let mut journal = Journal::default();
        let mut paths: Vec<PathBuf> = sealed_segments(path).into_iter().map(|(_, p)| p).collect();
        paths.push(path.to_path_buf());
        let mut offset = 0;
        for p in &paths {
            // A device or a directory named by mistake (`replay /dev/zero`) is refused
            // before it is read: a device need never end. A pipe is read (`replay
            // <(zcat journal.jsonl.gz)`), its lines bounded like a file's.
            if std::fs::metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                let kind = m.file_type();
                kind.is_dir() || kind.is_char_device() || kind.is_block_device() || kind.is_socket()
            }) {
                anyhow::bail!("journal {} is not a file", p.display());
            }
            let Ok(file) = File::open(p) else {
                if p == path && paths.len() > 1 {
                    continue;
                }
                anyhow::bail!("opening journal {}: not found", p.display());
            };
            let mut part = Journal::from_reader(BufReader::new(file))
                .with_context(|| format!("reading {}", p.display()))?;
            journal.records.append(&mut part.records);
            journal
                .skipped
                .extend(part.skipped.into_iter().map(|(n, why)| (n + offset, why)));
            journal
                .ref_lines
                .extend(part.ref_lines.into_iter().map(|n| n + offset));
            offset += part.lines;
        }
        let dir = snapshot_dir(path);
        let mut resolved = Vec::with_capacity(journal.records.len());
        let mut ref_lines = std::mem::take(&mut journal.ref_lines).into_iter();
        for record in journal.records.drain(..) {
            match record {
                Record::SnapshotRef {
                    cell,
                    wall_ms,
                    snapshot,
                    checkpoint,
                } => {
                    let line = ref_lines.next().unwrap_or(0);
                    let file = dir.join(format!("{snapshot}.json"));
                    let read = std::fs::read(&file)
                        .with_context(|| format!("reading {}", file.display()))
                        .and_then(|b| {
                            serde_json::from_slice::<Snapshot>(&b)
                                .with_context(|| format!("decoding {}", file.display()))
                        });
                    match read {
                        Ok(mut s) => {
                            s.fill_absent_columns();
                            let snapshot = Box::new(s);
                            resolved.push(if checkpoint {
                                Record::Checkpoint {
                                    cell,
                                    wall_ms,
                                    snapshot,
                                }
                            } else {
                                Record::Snapshot {
                                    cell,
                                    wall_ms,
                                    snapshot,
                                }
                            });
                        }
                        Err(e) => journal.skipped.push((line, format!("{e:#}"))),
                    }
                }
                other => resolved.push(other),
            }
        }
        journal.records = resolved;
        journal.skipped.sort_by_key(|(line, _)| *line);
        Ok(journal)
    }

    /// Reads journal lines from `source`: records in order, and the lines
    /// that are not records (a torn last line, a line that is not UTF-8, one
    /// longer than [`MAX_LINE_BYTES`]) set aside with their line number and the
    /// reason. Only an I/O error stops the reading.
    pub fn from_reader(mut source: impl BufRead) -> anyhow::Result<Journal> {
        let mut journal = Journal::default();
        let mut bytes = Vec::new();
        let mut number = 0usize;
        loop {
            bytes.clear();
            let read = (&mut source)
                .take(MAX_LINE_BYTES)
                .read_until(b'\n', &mut bytes)
                .with_context(|| format!("reading line {}", number + 1))?;
            if read == 0 {
                break;
            }
            number += 1;
            journal.lines = number;
            if read as u64 == MAX_LINE_BYTES && bytes.last() != Some(&b'\n') {
                skip_line(&mut source).with_context(|| format!("reading line {number}"))?;
                journal.skipped.push((
                    number,
                    format!(
                        "longer than {} MiB, more than any record (not a journal?)",
                        MAX_LINE_BYTES >> 20
                    ),
                ));
                continue;
            }
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
                Ok(r) => {
                    if matches!(r, Record::SnapshotRef { .. }) {
                        journal.ref_lines.push(number);
                    }
                    journal.records.push(r);
                }
                Err(e) => journal.skipped.push((i + 1, e.to_string())),
            }
        }
        Ok(journal)
    }

    /// Names of the cells that appear, in order of first appearance.
    pub fn cells(&self) -> Vec<String> {
        let mut cells: Vec<String> = Vec::new();
        for r in &self.records {
            let c = r.cell();
            if !cells.iter().any(|x| x == c) {
                cells.push(c.to_string());
            }
        }
        cells
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not a journal costs a bounded buffer: a line longer than any
    /// record is skipped (and said), the lines after it are read; a device is refused
    /// before it is read.
    #[test]
    fn an_overlong_line_is_skipped_and_a_device_refused() -> anyhow::Result<()> {
        let record = serde_json::to_string(&Record::Snapshot {
            cell: "control".into(),
            wall_ms: 7,
            snapshot: Box::default(),
        })?;
        let rest = format!("\n{record}\n");
        let source = std::io::repeat(b'x')
            .take(MAX_LINE_BYTES + 10)
            .chain(rest.as_bytes());
        let journal = Journal::from_reader(BufReader::new(source))?;
        assert_eq!(journal.records.len(), 1);
        assert_eq!(journal.lines, 2);
        assert_eq!(journal.skipped.len(), 1);
        assert_eq!(journal.skipped[0].0, 1);
        assert!(journal.skipped[0].1.contains("longer than 256 MiB"));

        let error = Journal::read(Path::new("/dev/zero")).expect_err("a device");
        assert!(format!("{error:#}").contains("is not a file"), "{error:#}");
        Ok(())
    }

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
        w.append(rec.clone())?;
        drop(w);
        let mut f = OpenOptions::new().append(true).open(&path)?;
        f.write_all(b"{\"kind\":\"round\",\"cel")?;
        let j = Journal::read(&path)?;
        assert_eq!(j.records, vec![rec.clone()]);
        assert_eq!(j.skipped.len(), 1);
        assert_eq!(j.cells(), vec!["control".to_string()]);
        // The host restarts on the torn journal: its first record is not glued onto the
        // torn one (which would lose it with it), and the torn one stays skipped.
        let mut w = JournalWriter::open(&path)?;
        w.append(rec.clone())?;
        drop(w);
        let j = Journal::read(&path)?;
        assert_eq!(j.records, vec![rec.clone(), rec]);
        assert_eq!(j.skipped.len(), 1);
        assert_eq!(j.skipped[0].0, 2, "{:?}", j.skipped);
        Ok(())
    }

    /// A journal a 0.1 host wrote (no speeds, no progress columns, bare
    /// model ids) still reads, and its snapshot still builds a mirror.
    #[test]
    fn a_snapshot_whose_file_is_lost_sets_its_own_line_aside() -> anyhow::Result<()> {
        use arbiter_host::state::{ClusterState, NodeRequest};
        let mut state = ClusterState::new();
        state.add_node(NodeRequest::gpus("n0", "default", "V100", 32_768, 2))?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("j.jsonl");
        let mut w = JournalWriter::open(&path)?;
        let mut snapshot = |wall_ms| Record::Snapshot {
            cell: "control".into(),
            wall_ms,
            snapshot: Box::new(state.snapshot()),
        };
        w.append(snapshot(1))?;
        drop(w);
        // A torn line, then the same snapshot again (one file, by digest) on line 3.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)?
            .write_all(b"{\"kind\"\n")?;
        let mut w = JournalWriter::open(&path)?;
        w.append(snapshot(2))?;
        drop(w);
        for entry in std::fs::read_dir(snapshot_dir(&path))? {
            std::fs::remove_file(entry?.path())?;
        }
        let j = Journal::read(&path)?;
        assert!(j.records.is_empty(), "{:?}", j.records);
        let lines: Vec<usize> = j.skipped.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, [1, 2, 3], "{:?}", j.skipped);
        assert!(j.skipped[0].1.contains("reading"), "{:?}", j.skipped);
        Ok(())
    }

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
