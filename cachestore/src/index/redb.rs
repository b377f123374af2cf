//! The production [`Index`]: a redb database (`index.redb`) with two tables.
//!
//! - `objects`: digest (32 bytes) → record (see `encode_record`).
//! - `by_wire`: wire hash → digests (multimap), kept in step with `objects` inside each transaction.

use std::path::Path;

use redb::{Database, Durability, MultimapTableDefinition, ReadableTable, TableDefinition};

use super::{decode_record, encode_record, Index, IndexOp, ObjectMeta};
use crate::digest::{Digest, WireHash};
use crate::error::{Error, Result};

const OBJECTS: TableDefinition<[u8; 32], &[u8]> = TableDefinition::new("objects");
const BY_WIRE: MultimapTableDefinition<u64, [u8; 32]> = MultimapTableDefinition::new("by_wire");

/// A redb-backed index. redb locks the file, so only one `RedbIndex` (one store) can use it at a time.
pub struct RedbIndex {
    db: Database,
}

impl RedbIndex {
    /// Opens or creates the index file, repairing it if the last writer crashed.
    ///
    /// Fails with [`Error::Locked`] when another store holds it, and with [`Error::Redb`] when the file is
    /// unreadable (the store then moves it aside and rebuilds).
    pub fn open(path: &Path) -> Result<RedbIndex> {
        let db = match Database::create(path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(Error::Locked { path: path.to_path_buf() });
            }
            Err(e) => return Err(Error::redb("open", e)),
        };
        let idx = RedbIndex { db };
        // Create both tables up front so read transactions never meet a missing table.
        let tx = idx.db.begin_write().map_err(|e| Error::redb("begin write", e))?;
        {
            tx.open_table(OBJECTS).map_err(|e| Error::redb("open table", e))?;
            tx.open_multimap_table(BY_WIRE).map_err(|e| Error::redb("open table", e))?;
        }
        tx.commit().map_err(|e| Error::redb("commit", e))?;
        Ok(idx)
    }
}

fn decode_entry(key: [u8; 32], value: &[u8]) -> Result<ObjectMeta> {
    decode_record(Digest(key), value)
}

impl Index for RedbIndex {
    fn get(&self, digest: &Digest) -> Result<Option<ObjectMeta>> {
        let tx = self.db.begin_read().map_err(|e| Error::redb("begin read", e))?;
        let t = tx.open_table(OBJECTS).map_err(|e| Error::redb("open table", e))?;
        match t.get(digest.0).map_err(|e| Error::redb("get", e))? {
            Some(v) => Ok(Some(decode_entry(digest.0, v.value())?)),
            None => Ok(None),
        }
    }

    fn by_wire_hash(&self, hash: WireHash) -> Result<Vec<Digest>> {
        let tx = self.db.begin_read().map_err(|e| Error::redb("begin read", e))?;
        let t = tx.open_multimap_table(BY_WIRE).map_err(|e| Error::redb("open table", e))?;
        let mut out = Vec::new();
        for v in t.get(hash.0).map_err(|e| Error::redb("get", e))? {
            out.push(Digest(v.map_err(|e| Error::redb("read", e))?.value()));
        }
        Ok(out)
    }

    fn scan(&self) -> Result<Vec<ObjectMeta>> {
        let tx = self.db.begin_read().map_err(|e| Error::redb("begin read", e))?;
        let t = tx.open_table(OBJECTS).map_err(|e| Error::redb("open table", e))?;
        let mut out = Vec::new();
        for item in t.iter().map_err(|e| Error::redb("scan", e))? {
            let (k, v) = item.map_err(|e| Error::redb("scan", e))?;
            out.push(decode_entry(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn apply(&self, ops: &[IndexOp], durable: bool) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin_write().map_err(|e| Error::redb("begin write", e))?;
        tx.set_durability(if durable { Durability::Immediate } else { Durability::Eventual });
        {
            let mut objects = tx.open_table(OBJECTS).map_err(|e| Error::redb("open table", e))?;
            let mut by_wire = tx.open_multimap_table(BY_WIRE).map_err(|e| Error::redb("open table", e))?;
            for op in ops {
                match op {
                    IndexOp::Put(m) => {
                        let old = objects
                            .insert(m.digest.0, encode_record(m).as_slice())
                            .map_err(|e| Error::redb("insert", e))?
                            .map(|v| decode_entry(m.digest.0, v.value()));
                        // An undecodable old record has no wire mapping we can find; drop it silently.
                        if let Some(Ok(old)) = old {
                            if let Some(w) = old.wire_hash {
                                by_wire.remove(w.0, m.digest.0).map_err(|e| Error::redb("remove", e))?;
                            }
                        }
                        if let Some(w) = m.wire_hash {
                            by_wire.insert(w.0, m.digest.0).map_err(|e| Error::redb("insert", e))?;
                        }
                    }
                    IndexOp::Remove(d) => {
                        let old = objects
                            .remove(d.0)
                            .map_err(|e| Error::redb("remove", e))?
                            .map(|v| decode_entry(d.0, v.value()));
                        if let Some(Ok(old)) = old {
                            if let Some(w) = old.wire_hash {
                                by_wire.remove(w.0, d.0).map_err(|e| Error::redb("remove", e))?;
                            }
                        }
                    }
                    IndexOp::Touch { digest, last_used_us, hits } => {
                        let cur = match objects.get(digest.0).map_err(|e| Error::redb("get", e))? {
                            Some(v) => decode_entry(digest.0, v.value())?,
                            None => continue,
                        };
                        let mut m = cur;
                        m.last_used_us = m.last_used_us.max(*last_used_us);
                        m.hits = m.hits.saturating_add(*hits);
                        objects
                            .insert(digest.0, encode_record(&m).as_slice())
                            .map_err(|e| Error::redb("insert", e))?;
                    }
                }
            }
        }
        tx.commit().map_err(|e| Error::redb("commit", e))
    }

    fn clear(&self) -> Result<()> {
        let tx = self.db.begin_write().map_err(|e| Error::redb("begin write", e))?;
        tx.delete_table(OBJECTS).map_err(|e| Error::redb("clear", e))?;
        tx.delete_multimap_table(BY_WIRE).map_err(|e| Error::redb("clear", e))?;
        {
            tx.open_table(OBJECTS).map_err(|e| Error::redb("open table", e))?;
            tx.open_multimap_table(BY_WIRE).map_err(|e| Error::redb("open table", e))?;
        }
        tx.commit().map_err(|e| Error::redb("commit", e))
    }
}
