//! The embedded durable store (redb) and its group-commit writer.
//!
//! Two tables: `jobs` (job id → JSON record) and `kv` (prefixed key → bytes)
//! for tenants, experiments, policy slots, policy blobs and metadata. Writers
//! never block on disk one by one: [`StoreWriter`] drains its queue into one
//! transaction per batch (one fsync for hundreds of submissions), and a caller
//! that must not answer before its write is durable waits on the returned
//! [`Ack`]. `kill -9` at any moment loses at most writes nobody was told about.

use anyhow::Context;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

type Reply = oneshot::Sender<Result<(), String>>;

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");

/// Most writes folded into one transaction.
const MAX_BATCH: usize = 8192;

/// One write.
#[derive(Debug)]
pub enum Write {
    Job(u64, Vec<u8>),
    /// A job record retention dropped.
    DeleteJob(u64),
    Put(String, Vec<u8>),
    Delete(String),
}

/// Everything in the store, read at start-up.
#[derive(Debug, Default)]
pub struct Contents {
    pub jobs: Vec<(u64, Vec<u8>)>,
    /// Sorted by key.
    pub kv: Vec<(String, Vec<u8>)>,
}

impl Contents {
    /// Entries whose key starts with `prefix`, with the prefix stripped.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a [u8])> {
        self.kv
            .iter()
            .filter_map(move |(k, v)| k.strip_prefix(prefix).map(|k| (k, v.as_slice())))
    }

    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.kv
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.kv[i].1.as_slice())
    }
}

/// The database file.
pub struct Store {
    db: Arc<ClosedSafely>,
    path: PathBuf,
}

/// The open database, closed without a panic escaping: redb commits when it
/// closes, and on a damaged file that commit can panic inside `Drop`.
struct ClosedSafely {
    db: Option<Database>,
    path: PathBuf,
    /// Held until the database has closed (see [`StoreLock`]).
    _lock: StoreLock,
}

/// Store files this process has open. A writer thread of an earlier [`Store`]
/// may still be closing one (a commit and an fsync, slow on a loaded disk)
/// when the plane reopens it; that is worth waiting for, where another process
/// holding the file is an error to say at once.
static OPEN_HERE: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The claim on a store file: an OS lock on `arbiter.redb.lock` beside it (so
/// a second process is refused at once, naming the one that holds it) and an
/// entry in [`OPEN_HERE`]. Both are released when it drops, after the database
/// has closed.
struct StoreLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl StoreLock {
    /// How long an earlier store of this process may take to close.
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

    fn take(path: &Path) -> anyhow::Result<StoreLock> {
        let give_up = std::time::Instant::now() + Self::PATIENCE;
        loop {
            let mut open = OPEN_HERE.lock().unwrap_or_else(|e| e.into_inner());
            if !open.contains(path) {
                let lock = Self::lock_file(path)?;
                open.insert(path.to_path_buf());
                return Ok(lock);
            }
            drop(open);
            if std::time::Instant::now() >= give_up {
                anyhow::bail!(
                    "the store {} is still open in this process after {:?} (an earlier \
                     control plane's writer has not finished closing it)",
                    path.display(),
                    Self::PATIENCE
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn lock_file(path: &Path) -> anyhow::Result<StoreLock> {
        let lock_path = path.with_extension("redb.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = std::io::Read::read_to_string(&mut file, &mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() || holder.len() > 20 {
                    String::new()
                } else {
                    format!(", pid {holder}")
                };
                anyhow::bail!(
                    "the store {} is open in another process{holder} (is another \
                     `arbiter serve` running on this data directory?)",
                    path.display()
                );
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", lock_path.display()));
            }
        }
        // Who holds it, for the next one refused.
        file.set_len(0)
            .and_then(|()| {
                std::io::Write::write_all(&mut file, std::process::id().to_string().as_bytes())
            })
            .with_context(|| format!("writing {}", lock_path.display()))?;
        Ok(StoreLock {
            path: path.to_path_buf(),
            _file: file,
        })
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        OPEN_HERE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.path);
    }
}

impl std::ops::Deref for ClosedSafely {
    type Target = Database;

    fn deref(&self) -> &Database {
        // `db` is `Some` from construction until `drop` takes it.
        match &self.db {
            Some(db) => db,
            None => unreachable!("the database is taken only when it is dropped"),
        }
    }
}

impl Drop for ClosedSafely {
    fn drop(&mut self) {
        let db = self.db.take();
        if let Err(e) = damage_refused(&self.path, move || drop(db)) {
            tracing::error!(error = %format!("{e:#}"), "closing the store");
        }
    }
}

/// Starting empty would forget every job and policy in a damaged store without
/// a word: say what is wrong and what the way out costs.
fn damaged_beyond_repair(path: &Path, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "the store {} is damaged beyond repair ({why}); move it aside to start with an \
         empty store (its jobs, tenants and policies are lost; the decision journal beside \
         it is kept and still replays)",
        path.display()
    )
}

/// Runs `f` on the store file at `path`, turning a panic inside redb into the
/// damaged-store error. redb checks most damage and says `Corrupted`, but some
/// damaged pages reach its `unreachable!()` (seen in redb 4.4 opening a file
/// whose pages were overwritten); that must not take the control plane down
/// with a backtrace instead of saying which file and what to do.
fn damage_refused<T>(path: &Path, f: impl FnOnce() -> T) -> anyhow::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let why = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("the store library failed");
        damaged_beyond_repair(path, why)
    })
}

impl Store {
    pub fn open(dir: &Path) -> anyhow::Result<Store> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("arbiter.redb");
        let lock = StoreLock::take(&path)?;
        let db = match damage_refused(&path, || Database::create(&path))? {
            Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(why))) => {
                return Err(damaged_beyond_repair(&path, &why));
            }
            // Held by something that does not take the lock file (not a control plane).
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                anyhow::bail!("the store {} is open in another process", path.display())
            }
            other => other.with_context(|| format!("opening {}", path.display()))?,
        };
        let db = ClosedSafely {
            db: Some(db),
            path: path.clone(),
            _lock: lock,
        };
        // Create the tables so that readers never meet a missing one.
        damage_refused(&path, || {
            let tx = db.begin_write().context("store: begin")?;
            tx.open_table(JOBS).context("store: jobs table")?;
            tx.open_table(KV).context("store: kv table")?;
            tx.commit().context("store: commit")
        })??;
        Ok(Store {
            db: Arc::new(db),
            path,
        })
    }

    pub fn read_all(&self) -> anyhow::Result<Contents> {
        damage_refused(&self.path, || self.read_all_unguarded())?
            .with_context(|| format!("reading {}", self.path.display()))
    }

    fn read_all_unguarded(&self) -> anyhow::Result<Contents> {
        let tx = self.db.begin_read().context("store: begin read")?;
        let mut contents = Contents::default();
        let jobs = tx.open_table(JOBS).context("store: jobs table")?;
        for item in jobs.iter().context("store: iterating jobs")? {
            let (k, v) = item.context("store: reading a job")?;
            contents.jobs.push((k.value(), v.value().to_vec()));
        }
        let kv = tx.open_table(KV).context("store: kv table")?;
        for item in kv.iter().context("store: iterating kv")? {
            let (k, v) = item.context("store: reading a key")?;
            contents
                .kv
                .push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(contents)
    }

    /// Starts the group-commit writer thread.
    pub fn writer(&self) -> anyhow::Result<StoreWriter> {
        let (tx, rx) = mpsc::channel::<(Write, Option<Reply>)>();
        let db = Arc::clone(&self.db);
        let path = self.path.clone();
        let thread = std::thread::Builder::new()
            .name("arbiter-store".into())
            .spawn(move || write_loop(&db, &path, &rx))
            .context("spawning the store writer")?;
        Ok(StoreWriter {
            tx,
            _thread: Arc::new(thread),
        })
    }
}

fn write_loop(db: &Database, path: &Path, rx: &mpsc::Receiver<(Write, Option<Reply>)>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let result = damage_refused(path, || commit(db, &batch))
            .and_then(|committed| committed)
            .map_err(|e| format!("{e:#}"));
        if let Err(e) = &result {
            tracing::error!(error = %e, writes = batch.len(), "store commit failed");
        }
        for (_, ack) in batch {
            if let Some(ack) = ack {
                let _ = ack.send(result.clone());
            }
        }
    }
}

fn commit(db: &Database, batch: &[(Write, Option<Reply>)]) -> anyhow::Result<()> {
    let tx = db.begin_write().context("begin")?;
    {
        let mut jobs = tx.open_table(JOBS).context("jobs table")?;
        let mut kv = tx.open_table(KV).context("kv table")?;
        for (write, _) in batch {
            match write {
                Write::Job(id, bytes) => {
                    jobs.insert(*id, bytes.as_slice()).context("insert job")?;
                }
                Write::DeleteJob(id) => {
                    jobs.remove(*id).context("remove job")?;
                }
                Write::Put(key, bytes) => {
                    kv.insert(key.as_str(), bytes.as_slice())
                        .context("insert key")?;
                }
                Write::Delete(key) => {
                    kv.remove(key.as_str()).context("remove key")?;
                }
            }
        }
    }
    tx.commit().context("commit")?;
    Ok(())
}

/// A handle to the writer thread; clone freely.
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::Sender<(Write, Option<Reply>)>,
    _thread: Arc<JoinHandle<()>>,
}

/// Completion of a durable write.
pub struct Ack(oneshot::Receiver<Result<(), String>>);

fn outcome(r: Result<Result<(), String>, oneshot::error::RecvError>) -> anyhow::Result<()> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(anyhow::anyhow!("store write failed: {e}")),
        Err(_) => Err(anyhow::anyhow!("store writer stopped")),
    }
}

impl Ack {
    /// Blocks until the write is on disk (not from an async task).
    pub fn wait(self) -> anyhow::Result<()> {
        outcome(self.0.blocking_recv())
    }

    /// Waits until the write is on disk.
    pub async fn done(self) -> anyhow::Result<()> {
        outcome(self.0.await)
    }
}

impl StoreWriter {
    /// Queues a write; nobody waits for it.
    pub fn send(&self, write: Write) {
        if self.tx.send((write, None)).is_err() {
            tracing::error!("store writer stopped; a write is lost");
        }
    }

    /// Queues writes; the returned [`Ack`] completes when all are durable.
    pub fn send_durable(&self, writes: Vec<Write>) -> Ack {
        let (ack_tx, ack_rx) = oneshot::channel();
        let n = writes.len();
        if n == 0 {
            let _ = ack_tx.send(Ok(()));
            return Ack(ack_rx);
        }
        let mut ack_tx = Some(ack_tx);
        for (i, w) in writes.into_iter().enumerate() {
            // Only the last write of the group is acknowledged: it commits in
            // the same transaction as the others, or after them.
            let ack = if i + 1 == n { ack_tx.take() } else { None };
            if let Err(mpsc::SendError((_, Some(reply)))) = self.tx.send((w, ack)) {
                let _ = reply.send(Err("store writer stopped".into()));
            }
        }
        Ack(ack_rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_damaged_beyond_repair_is_refused_with_the_way_out() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = closed_store_with_a_write(dir.path())?;
        let mut bytes = std::fs::read(&path)?;
        // Both commit slots of the header and every page after it overwritten, the magic
        // number kept: a redb file with no root to recover.
        for (i, b) in bytes.iter_mut().enumerate().skip(16) {
            *b = (i % 251) as u8;
        }
        std::fs::write(&path, &bytes)?;
        let error = match Store::open(dir.path()) {
            Ok(_) => anyhow::bail!("a damaged store opened"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            error.contains("damaged beyond repair") && error.contains("move it aside"),
            "{error}"
        );
        Ok(())
    }

    #[test]
    fn a_store_another_holder_has_locked_is_refused_at_once_naming_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let lock = dir.path().join("arbiter.redb.lock");
        std::fs::write(&lock, "4242")?;
        // A lock of another open file description conflicts as another process's does.
        let held = std::fs::File::open(&lock)?;
        held.try_lock()?;
        let error = match Store::open(dir.path()) {
            Ok(_) => anyhow::bail!("a locked store opened"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            error.contains("is open in another process, pid 4242 (is another `arbiter serve`"),
            "{error}"
        );
        drop(held);
        let store = Store::open(dir.path())?;
        assert_eq!(
            std::fs::read_to_string(&lock)?,
            std::process::id().to_string()
        );
        drop(store);
        Ok(())
    }

    #[test]
    fn reopening_in_this_process_waits_for_the_earlier_store_to_close() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let first = Store::open(dir.path())?;
        let path = dir.path().to_path_buf();
        let second = std::thread::spawn(move || Store::open(&path).map(drop));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!second.is_finished(), "opened beside an open store");
        drop(first);
        second
            .join()
            .map_err(|_| anyhow::anyhow!("the opener panicked"))??;
        Ok(())
    }

    /// A store holding one durable write, closed: its writer thread finished and
    /// the file released, so that nothing writes to it after the test damages it.
    fn closed_store_with_a_write(dir: &Path) -> anyhow::Result<PathBuf> {
        {
            let store = Store::open(dir)?;
            store
                .writer()?
                .send_durable(vec![Write::Put("tenant/a".into(), b"1".to_vec())])
                .wait()?;
        }
        // Opening waits for the writer thread to let go of the file; dropping this
        // one closes it for good.
        drop(Store::open(dir)?);
        Ok(dir.join("arbiter.redb"))
    }

    /// Whatever the damage, opening and reading the store either works or says the
    /// store is damaged; it never panics (CI once met redb's `unreachable!()` on a
    /// damaged file and the control plane would have died with a backtrace).
    #[test]
    fn no_damage_to_the_file_panics_the_store() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = closed_store_with_a_write(dir.path())?;
        let pristine = std::fs::read(&path)?;
        let len = pristine.len();
        let mut outcomes = (0, 0);
        // Runs of garbage from every region of the file: the header, its commit
        // slots, the region headers and the pages; plus a truncation sweep.
        let starts = (0..len).step_by((len / 97).max(1));
        for (trial, start) in starts.enumerate() {
            for run in [8usize, 64, 512, 4096] {
                let mut bytes = pristine.clone();
                for (i, b) in bytes.iter_mut().enumerate().skip(start).take(run) {
                    *b = ((i * 31 + trial * 7) % 251) as u8;
                }
                std::fs::write(&path, &bytes)?;
                match std::panic::catch_unwind(|| {
                    Store::open(dir.path()).and_then(|store| store.read_all())
                }) {
                    Ok(Ok(_)) => outcomes.0 += 1,
                    Ok(Err(e)) => {
                        let e = format!("{e:#}");
                        assert!(e.contains(&path.display().to_string()), "{e}");
                        outcomes.1 += 1;
                    }
                    Err(_) => anyhow::bail!("{run} damaged bytes at {start} panicked the store"),
                }
            }
        }
        for cut in (0..len).step_by((len / 31).max(1)) {
            std::fs::write(&path, &pristine[..cut])?;
            let opened = std::panic::catch_unwind(|| {
                Store::open(dir.path()).and_then(|store| store.read_all())
            });
            anyhow::ensure!(opened.is_ok(), "a file cut at {cut} panicked the store");
        }
        // Some damage lands where redb does not look (free pages), some where it must.
        assert!(outcomes.0 > 0 && outcomes.1 > 0, "{outcomes:?}");
        Ok(())
    }

    #[test]
    fn writes_survive_reopen_and_prefixes_filter() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let store = Store::open(dir.path())?;
            let w = store.writer()?;
            w.send(Write::Put("tenant/a".into(), b"1".to_vec()));
            w.send_durable(vec![
                Write::Job(7, b"{}".to_vec()),
                Write::Put("tenant/b".into(), b"2".to_vec()),
                Write::Put("exp/x".into(), b"3".to_vec()),
                Write::Job(8, b"{}".to_vec()),
            ])
            .wait()?;
            w.send_durable(vec![Write::DeleteJob(8)]).wait()?;
        }
        let store = Store::open(dir.path())?;
        let c = store.read_all()?;
        assert_eq!(c.jobs, vec![(7, b"{}".to_vec())]);
        let tenants: Vec<_> = c.with_prefix("tenant/").collect();
        assert_eq!(tenants, vec![("a", &b"1"[..]), ("b", &b"2"[..])]);
        assert_eq!(c.get("exp/x"), Some(&b"3"[..]));
        assert_eq!(c.get("exp/y"), None);
        Ok(())
    }
}
