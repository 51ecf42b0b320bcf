//! Upgrades of older store formats, run once by `init` inside its transaction.

use std::collections::BTreeMap;

use agenthost_model::{InboxRow, Seq};
use redb::{ReadableTable, WriteTransaction};

use crate::codec::{decode, encode};
use crate::error::{Result, storage};
use crate::tables::{WORK, legacy};
use crate::work::Work;

/// Formats 1–2 kept a row per pending input (in `inbox`, and from format 2 also in
/// `inbox_front`) and the recovery sets `claims` and `pending`. Format 3 keeps all of it in one
/// work row per session; the inputs' prompts are already in their `PromptAdmitted` events.
pub(crate) fn into_work_rows(txn: &WriteTransaction) -> Result<()> {
    let mut works: BTreeMap<String, Work> = BTreeMap::new();
    let mut waiting = |session: &str, seq: u64, bytes: &[u8]| -> Result<()> {
        let row: InboxRow = decode("inbox row", bytes)?;
        works
            .entry(session.to_owned())
            .or_default()
            .add(Seq(seq), row.delivery);
        Ok(())
    };
    {
        let inbox = txn.open_table(legacy::INBOX).map_err(storage)?;
        for entry in inbox.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (session, seq) = key.value();
            waiting(session, seq, value.value())?;
        }
        let front = txn.open_table(legacy::INBOX_FRONT).map_err(storage)?;
        for entry in front.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (_, session, seq) = key.value();
            waiting(session, seq, value.value())?;
        }
        let claims = txn.open_table(legacy::CLAIMS).map_err(storage)?;
        for entry in claims.iter().map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            works.entry(key.value().to_owned()).or_default().claimed = true;
        }
    }
    txn.delete_table(legacy::INBOX).map_err(storage)?;
    txn.delete_table(legacy::INBOX_FRONT).map_err(storage)?;
    txn.delete_table(legacy::CLAIMS).map_err(storage)?;
    txn.delete_table(legacy::PENDING).map_err(storage)?;
    let mut table = txn.open_table(WORK).map_err(storage)?;
    for (session, work) in &works {
        table
            .insert(session.as_str(), encode(work).as_slice())
            .map_err(storage)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use agenthost_model::{Delivery, MessageId, Prompt};
    use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableHandle};

    use super::*;
    use crate::work::Waiting;

    fn inbox_row(seq: u64, delivery: Delivery) -> Vec<u8> {
        encode(&InboxRow {
            id: MessageId::parse(&format!("msg_{seq}")).expect("id"),
            admitted_seq: Seq(seq),
            delivery,
            prompt: Prompt::text("hi"),
        })
    }

    #[test]
    fn inbox_rows_and_claims_become_work_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(dir.path().join("old.redb")).expect("db");
        let txn = db.begin_write().expect("txn");
        {
            let mut inbox = txn.open_table(legacy::INBOX).expect("inbox");
            let row = inbox_row(3, Delivery::Queue);
            inbox.insert(("ses_a", 3), row.as_slice()).expect("insert");
            let mut front = txn.open_table(legacy::INBOX_FRONT).expect("front");
            let row = inbox_row(1, Delivery::Steer);
            front.insert((7, "ses_a", 1), row.as_slice()).expect("insert");
            let mut claims = txn.open_table(legacy::CLAIMS).expect("claims");
            claims.insert("ses_b", ()).expect("insert");
            let mut pending = txn.open_table(legacy::PENDING).expect("pending");
            pending.insert("ses_a", ()).expect("insert");
        }
        into_work_rows(&txn).expect("upgraded");
        txn.commit().expect("commit");

        let read = db.begin_read().expect("read");
        let work = read.open_table(WORK).expect("work");
        let row = |s: &str| -> Work {
            decode("work row", work.get(s).expect("get").expect("row").value()).expect("decode")
        };
        let waiting = |seq, delivery| Waiting {
            seq: Seq(seq),
            delivery,
        };
        let a = Work {
            claimed: false,
            inbox: vec![waiting(1, Delivery::Steer), waiting(3, Delivery::Queue)],
        };
        assert_eq!(row("ses_a"), a);
        let b = Work {
            claimed: true,
            inbox: vec![],
        };
        assert_eq!(row("ses_b"), b);
        assert_eq!(work.len().expect("len"), 2);
        for name in ["inbox", "inbox_front", "claims", "pending"] {
            let listed = read.list_tables().expect("tables").any(|t| t.name() == name);
            assert!(!listed, "{name} is deleted");
        }
    }
}
