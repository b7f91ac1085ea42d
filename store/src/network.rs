//! The session network's records: an agent's default mode and rules, a
//! session's mode and rules. They live in the index, outside every
//! workspace: a rollback keeps them; a delete takes them with it.

use super::{Result, Store};
use crate::index::NetworkRecord;
use allox_protocol::Egress;

impl Store {
    /// The record of agent `a` (`s` = `None`) or of session `a/s`; one
    /// that was never written reads as the default (no mode, no rules).
    pub fn network_of(&self, a: &str, s: Option<&str>) -> Result<NetworkRecord> {
        let key = self.level_key(a, s)?;
        Ok(self.index.network(&key)?.unwrap_or_default())
    }

    /// Replaces the egress rules of agent `a` or session `a/s` (the mode
    /// stays as it is).
    pub fn network_egress_set(
        &self,
        a: &str,
        s: Option<&str>,
        egress: &Egress,
    ) -> Result<NetworkRecord> {
        let _g = self.guard();
        let key = self.level_key(a, s)?;
        let mut rec = self.index.network(&key)?.unwrap_or_default();
        rec.egress = Some(egress.clone());
        self.index.write(|w| w.put_network(&key, &rec))?;
        Ok(rec)
    }
}
