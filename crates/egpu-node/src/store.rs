//! The slice store: every slice the agent owns, persisted in an embedded
//! redb database (`<state-dir>/egpud.redb`), one JSON record per slice.
//!
//! Writes are durable transactions: a slice is in the store before its
//! limits are published, so a restarted agent finds every slice a client was
//! told about. A store that cannot be read is an error that stops the agent:
//! it never starts empty on top of a damaged store.

use egpu_core::SliceSpec;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

const SLICES: TableDefinition<&str, &[u8]> = TableDefinition::new("slices");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Version of the record format below: 2 since records may carry
/// `workload`, owners `boot_id` and device shares `memory_burst`, which a
/// build of version 1 would refuse or silently drop; 3 since they carry
/// `rev`, which a build of version 2 would refuse. Opening a store of an older version
/// raises it (the records then still decode: new fields are optional);
/// a build finding a newer one refuses it with [`StoreError::Schema`].
pub const SCHEMA_VERSION: u64 = 3;
/// File name of the store under the state directory.
pub const STORE_FILE: &str = "egpud.redb";

/// The process that owns an ephemeral slice (`egpu run`), identified across
/// pid reuse and reboots.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    pub pid: u32,
    /// Start time of the process in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`): after a
    /// reboot, a process of the same pid and start time is another one.
    /// Absent in records written before this field existed (and where the
    /// kernel does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// One persisted slice.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceRecord {
    pub id: String,
    pub spec: SliceSpec,
    /// UUIDs of the slice's devices, slice order, as discovered at creation.
    pub device_uuids: Vec<String>,
    pub ephemeral: bool,
    pub owner: Option<Owner>,
    pub created_unix: u64,
    /// The program an ephemeral slice runs (the child `egpu run` started), once its CLI
    /// reported it. Absent in records written before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Owner>,
    /// Revision of `spec`: 1 at creation, one more at every resize. The
    /// slice's limits file publishes the same number with the spec, after
    /// the store has committed it, so a file ahead of its record is a change
    /// the store lost (a damaged store that redb rolled back to its previous
    /// commit): adoption takes the spec back from the file. 0 in records
    /// written before this field existed (schema 2), until adoption gives
    /// them 1.
    #[serde(default)]
    pub rev: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create state directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state store {path} cannot be opened ({detail}). egpud refuses to start rather than lose slices. \
         If the file is damaged, move it aside (`mv {path} {path}.broken`) and start egpud again with \
         --adopt-unstored-slices: it takes the live slices back from their limits files, and their workloads run on \
         (slices with no live process, and every slice after a reboot, are lost with the store). \
         With --drop-unstored-slices instead it starts with no slices; a workload still running keeps the memory it holds \
         but can allocate no more, so restart it in a new slice"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error("state store {path} is open in another process (another egpud with the same --state-dir?); stop it, or give this egpud its own --state-dir")]
    InUse { path: PathBuf },
    #[error("state store {path}: {op} failed")]
    Db {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("cannot create the state store {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state store {path} was written by a newer egpud (schema {found}, this build reads {SCHEMA_VERSION}); run that egpud or move the store aside")]
    Schema { path: PathBuf, found: u64 },
}

pub struct Store {
    /// After a write fails on I/O (a full disk) redb refuses every later
    /// transaction until the database is opened again, so [`Store::with_db`]
    /// opens it again (recovering the last committed state) instead of
    /// leaving the node unable to change a slice until egpud restarts;
    /// `None` while that failed too, until the next call.
    db: std::sync::Mutex<Option<redb::Database>>,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) `<state_dir>/egpud.redb` and checks every record decodes.
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|source| StoreError::Dir { path: state_dir.into(), source })?;
        let path = state_dir.join(STORE_FILE);
        let corrupt = |detail: String| StoreError::Corrupt { path: path.clone(), detail };
        if !path.exists() {
            Self::create_new(state_dir, &path)?;
        }
        // A new store only ever appears whole (above), so an empty file is
        // damage (a full disk, a bad copy), never a first start: redb would
        // silently start it afresh and the node would pass for a new one.
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            return Err(corrupt("the file is empty (0 bytes)".into()));
        }
        // redb may panic (debug builds) on files it did not write; treat that as corruption too.
        let opened = std::panic::catch_unwind(|| redb::Database::create(&path));
        let db = match opened {
            Ok(Ok(db)) => db,
            // Not damage: the advice to move the file aside would be wrong here.
            Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => return Err(StoreError::InUse { path }),
            Ok(Err(e)) => return Err(corrupt(e.to_string())),
            Err(_) => return Err(corrupt("the database code panicked reading it".into())),
        };
        let store = Store { db: std::sync::Mutex::new(Some(db)), path };
        store.init_schema()?;
        // Decode everything now, so a bad record stops the start, not a later request.
        store.load_all()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes a new store with its schema under a temporary name of its own
    /// (created exclusively, so two egpuds, even both pid 1 in their
    /// containers, never share one) and links it into place only then, so
    /// that `path` never exists half made. Another egpud that made one
    /// meanwhile wins (`hard_link` never replaces). On a filesystem without
    /// hard links the store is renamed into place if nothing is there yet.
    fn create_new(state_dir: &Path, path: &Path) -> Result<(), StoreError> {
        struct Tmp(PathBuf);
        impl Drop for Tmp {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let create_err = |source| StoreError::Create { path: path.into(), source };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut attempt = 0u32;
        let tmp = loop {
            let p = state_dir.join(format!("{STORE_FILE}.new.{}.{nanos}.{attempt}", std::process::id()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&p) {
                Ok(_) => break Tmp(p),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => return Err(create_err(e)),
            }
        };
        // redb makes a new database in an empty file.
        let db = redb::Database::create(&tmp.0).map_err(|e| StoreError::Db { path: tmp.0.clone(), op: "create", source: Box::new(e.into()) })?;
        Store { db: std::sync::Mutex::new(Some(db)), path: tmp.0.clone() }.init_schema()?;
        match std::fs::hard_link(&tmp.0, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            Err(_) if !path.exists() => std::fs::rename(&tmp.0, path).map_err(create_err)?,
            Err(e) => return Err(create_err(e)),
        }
        // The new name is durable before anything is stored under it.
        if let Ok(d) = std::fs::File::open(state_dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn db_err(&self, op: &'static str) -> impl FnOnce(redb::Error) -> StoreError + '_ {
        move |source| StoreError::Db { path: self.path.clone(), op, source: Box::new(source) }
    }

    /// Opens the database again after an I/O error, as [`Store::open`]
    /// judges what it finds (another process holding it, a panic in redb).
    fn reopen(&self) -> Result<redb::Database, StoreError> {
        match std::panic::catch_unwind(|| redb::Database::create(&self.path)) {
            Ok(Ok(db)) => Ok(db),
            Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => Err(StoreError::InUse { path: self.path.clone() }),
            Ok(Err(e)) => Err(StoreError::Db { path: self.path.clone(), op: "reopen", source: Box::new(e.into()) }),
            Err(_) => Err(StoreError::Corrupt { path: self.path.clone(), detail: "the database code panicked reading it".into() }),
        }
    }

    /// Runs `f` on the database. If `f` fails on I/O, the database is
    /// closed and opened again at once (redb refuses every later
    /// transaction until then), so its file goes without redb's lock only
    /// between the two, not until the next request; if opening fails too
    /// (the disk is still full), the next call tries again.
    fn with_db<T>(&self, f: impl FnOnce(&redb::Database) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut db = self.db.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if db.is_none() {
            *db = Some(self.reopen()?);
            tracing::warn!("state store {} opened again after an I/O error", self.path.display());
        }
        let r = f(db.as_ref().expect("opened above"));
        if let Err(StoreError::Db { source, op, .. }) = &r
            && matches!(**source, redb::Error::Io(_) | redb::Error::PreviousIo)
        {
            tracing::error!("state store {}: {op} failed on I/O ({source}): nothing was changed (free space in the state directory if it is full)", self.path.display());
            *db = None;
            match self.reopen() {
                Ok(again) => *db = Some(again),
                Err(e) => tracing::error!("state store {} could not be opened again ({e}); the next change tries again", self.path.display()),
            }
        }
        r
    }

    fn init_schema(&self) -> Result<(), StoreError> {
        self.with_db(|db| self.init_schema_in(db))
    }

    fn init_schema_in(&self, db: &redb::Database) -> Result<(), StoreError> {
        let tx = db.begin_write().map_err(|e| self.db_err("begin")(e.into()))?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.db_err("open meta")(e.into()))?;
            let found = meta.get("schema").map_err(|e| self.db_err("read meta")(e.into()))?.map(|v| v.value());
            match found {
                Some(v) if v > SCHEMA_VERSION => return Err(StoreError::Schema { path: self.path.clone(), found: v }),
                Some(v) if v == SCHEMA_VERSION => {}
                _ => {
                    meta.insert("schema", SCHEMA_VERSION).map_err(|e| self.db_err("write meta")(e.into()))?;
                }
            }
            tx.open_table(SLICES).map_err(|e| self.db_err("open slices")(e.into()))?;
        }
        tx.commit().map_err(|e| self.db_err("commit")(e.into()))
    }

    /// Every stored slice, by name order.
    pub fn load_all(&self) -> Result<Vec<SliceRecord>, StoreError> {
        self.with_db(|db| self.load_all_in(db))
    }

    fn load_all_in(&self, db: &redb::Database) -> Result<Vec<SliceRecord>, StoreError> {
        let tx = db.begin_read().map_err(|e| self.db_err("begin read")(e.into()))?;
        let t = tx.open_table(SLICES).map_err(|e| self.db_err("open slices")(e.into()))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.db_err("scan")(e.into()))? {
            let (k, v) = row.map_err(|e| self.db_err("scan")(e.into()))?;
            let rec: SliceRecord = serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("record '{}' does not decode: {e}", k.value()),
            })?;
            out.push(rec);
        }
        Ok(out)
    }

    /// Inserts or replaces `rec` durably.
    pub fn put(&self, rec: &SliceRecord) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(rec).expect("slice records always serialize");
        self.with_db(|db| {
            let tx = db.begin_write().map_err(|e| self.db_err("begin")(e.into()))?;
            {
                let mut t = tx.open_table(SLICES).map_err(|e| self.db_err("open slices")(e.into()))?;
                t.insert(rec.spec.name.as_str(), bytes.as_slice()).map_err(|e| self.db_err("insert")(e.into()))?;
            }
            tx.commit().map_err(|e| self.db_err("commit")(e.into()))
        })
    }

    /// Removes slice `name` durably; no error if absent.
    pub fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.with_db(|db| {
            let tx = db.begin_write().map_err(|e| self.db_err("begin")(e.into()))?;
            {
                let mut t = tx.open_table(SLICES).map_err(|e| self.db_err("open slices")(e.into()))?;
                t.remove(name).map_err(|e| self.db_err("remove")(e.into()))?;
            }
            tx.commit().map_err(|e| self.db_err("commit")(e.into()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egpu_core::{Bytes, DeviceShare, Percent, Priority};

    fn rec(name: &str) -> SliceRecord {
        SliceRecord {
            id: format!("id-{name}"),
            spec: SliceSpec {
                name: name.into(),
                priority: Priority::High,
                devices: vec![DeviceShare { device: 0, memory: Bytes::gib(1), memory_burst: Bytes(0), compute_share: Percent(2500), compute_limit: Percent::FULL }],
            },
            device_uuids: vec!["GPU-x".into()],
            ephemeral: true,
            owner: Some(Owner { pid: 42, start_ticks: 7, boot_id: None }),
            created_unix: 1,
            workload: None,
            rev: 1,
        }
    }

    #[test]
    fn an_older_store_is_raised_to_this_version_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let set = |v: u64| {
            let s = Store::open(dir.path()).unwrap();
            let db = s.db.lock().unwrap().take().unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META).unwrap().insert("schema", v).unwrap();
            tx.commit().unwrap();
        };
        let get = |s: &Store| s.db.lock().unwrap().as_ref().unwrap().begin_read().unwrap().open_table(META).unwrap().get("schema").unwrap().unwrap().value();
        set(1);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(get(&s), SCHEMA_VERSION, "an older build now gets the 'written by a newer egpud' error, not a decode failure");
        drop(s);
        set(SCHEMA_VERSION + 1);
        let e = Store::open(dir.path()).err().expect("refused");
        assert!(matches!(e, StoreError::Schema { found, .. } if found == SCHEMA_VERSION + 1), "{e}");
    }

    #[test]
    fn records_without_a_workload_still_decode_and_with_one_round_trip() {
        // A record without a workload is written exactly as before the field existed.
        let old = serde_json::to_string(&rec("a")).unwrap();
        assert!(!old.contains("workload"), "{old}");
        let mut r: SliceRecord = serde_json::from_str(&old).unwrap();
        assert_eq!(r.workload, None);
        r.workload = Some(Owner { pid: 5, start_ticks: 6, boot_id: Some("b".into()) });
        let back: SliceRecord = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.workload, Some(Owner { pid: 5, start_ticks: 6, boot_id: Some("b".into()) }));
        // A record stored before burst caps existed has none.
        let before_burst = old.replace(",\"memory_burst\":0", "");
        assert!(!before_burst.contains("memory_burst"), "{before_burst}");
        let r: SliceRecord = serde_json::from_str(&before_burst).unwrap();
        assert_eq!(r.spec.devices[0].memory_burst, Bytes(0));
    }

    #[test]
    fn roundtrip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.put(&rec("a")).unwrap();
            s.put(&rec("b")).unwrap();
            s.remove("a").unwrap();
            s.remove("missing").unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.load_all().unwrap(), vec![rec("b")]);
    }

    #[test]
    fn store_open_elsewhere_is_not_called_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        let e = Store::open(dir.path()).err().expect("must refuse");
        let msg = e.to_string();
        assert!(matches!(e, StoreError::InUse { .. }), "{msg}");
        assert!(!msg.contains("move it aside"), "{msg}");
    }

    #[test]
    fn a_new_store_appears_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.put(&rec("a")).unwrap();
        drop(s);
        assert!(std::fs::metadata(dir.path().join(STORE_FILE)).unwrap().len() > 0);
        let names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, [STORE_FILE], "only the store is left");
        assert_eq!(Store::open(dir.path()).unwrap().load_all().unwrap(), vec![rec("a")]);
    }

    #[test]
    fn racing_first_starts_make_one_whole_store() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let opened: Vec<Result<Store, StoreError>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4).map(|_| s.spawn(|| Store::open(dir.path()))).collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            // Each either opened the one store or found it open; none saw it half made.
            for r in &opened {
                assert!(matches!(r, Ok(_) | Err(StoreError::InUse { .. })), "{:?}", r.as_ref().err());
            }
            drop(opened);
            let names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            assert_eq!(names, [STORE_FILE]);
            Store::open(dir.path()).unwrap().put(&rec("a")).unwrap();
        }
    }

    #[test]
    fn empty_file_is_refused_not_started_afresh() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STORE_FILE), b"").unwrap();
        let e = Store::open(dir.path()).err().expect("must refuse");
        assert!(matches!(e, StoreError::Corrupt { .. }) && e.to_string().contains("empty (0 bytes)"), "{e}");
        assert_eq!(std::fs::metadata(dir.path().join(STORE_FILE)).unwrap().len(), 0, "the file is left as it was");
    }

    #[test]
    fn garbage_file_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STORE_FILE), vec![0x5au8; 8192]).unwrap();
        let e = Store::open(dir.path()).err().expect("must refuse");
        let msg = e.to_string();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{msg}");
        assert!(msg.contains("egpud.redb") && msg.contains("move it aside"), "{msg}");
    }
}
