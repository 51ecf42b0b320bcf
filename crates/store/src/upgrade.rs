//! Upgrades of older store formats, run once by `init` inside its transaction.

use std::collections::{BTreeMap, BTreeSet};

use agenthost_model::{InboxRow, Seq, SessionRow};
use redb::{ReadableTable, WriteTransaction};

use crate::codec::{decode, encode};
use crate::error::{Result, storage};
use crate::record::{Inbox, SessionRecord};
use crate::tables::{SESSIONS, WORKING, legacy};

/// Formats 1–2 kept a bare session row per session, a row per pending input (in `inbox`, and
/// from format 2 also in `inbox_front`), and the recovery sets `claims` and `pending`. Format 3
/// keeps each session's row and inbox in one record and one working set; the inputs' prompts are
/// already in their `PromptAdmitted` events.
pub(crate) fn into_records(txn: &WriteTransaction) -> Result<()> {
    let mut inboxes: BTreeMap<String, Inbox> = BTreeMap::new();
    let mut waiting = |session: &str, seq: u64, bytes: &[u8]| -> Result<()> {
        // Decoded only to check it: the input's delivery and prompt are in its event.
        let _: InboxRow = decode("inbox row", bytes)?;
        inboxes.entry(session.to_owned()).or_default().add(Seq(seq));
        Ok(())
    };
    let mut working = BTreeSet::new();
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
        for set in [legacy::CLAIMS, legacy::PENDING] {
            let table = txn.open_table(set).map_err(storage)?;
            for entry in table.iter().map_err(storage)? {
                let (key, _) = entry.map_err(storage)?;
                working.insert(key.value().to_owned());
            }
        }
    }
    for table in [legacy::CLAIMS, legacy::PENDING] {
        txn.delete_table(table).map_err(storage)?;
    }
    txn.delete_table(legacy::INBOX).map_err(storage)?;
    txn.delete_table(legacy::INBOX_FRONT).map_err(storage)?;

    let mut sessions = txn.open_table(SESSIONS).map_err(storage)?;
    let mut records = Vec::new();
    for entry in sessions.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let row: SessionRow = decode("session row", value.value())?;
        let inbox = inboxes.remove(key.value()).unwrap_or_default();
        records.push(SessionRecord { row, inbox });
    }
    for record in &records {
        sessions
            .insert(record.row.id.as_str(), encode(record).as_slice())
            .map_err(storage)?;
    }
    let mut set = txn.open_table(WORKING).map_err(storage)?;
    for session in &working {
        set.insert(session.as_str(), ()).map_err(storage)?;
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use agenthost_model::message::Claim;
    use agenthost_model::{Delivery, MessageId, Prompt};
    use redb::{Database, ReadableDatabase, TableHandle};

    use super::*;
    use crate::tests::session_row;

    fn inbox_row(seq: u64, delivery: Delivery) -> Vec<u8> {
        encode(&InboxRow {
            id: MessageId::parse(&format!("msg_{seq}")).expect("id"),
            admitted_seq: Seq(seq),
            delivery,
            prompt: Prompt::text("hi"),
        })
    }

    #[test]
    fn session_rows_inbox_rows_and_recovery_sets_become_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(dir.path().join("old.redb")).expect("db");
        let a = session_row("ses_a", 2, None);
        let claim = Claim {
            seq: Seq(3),
            forced: false,
        };
        let b = session_row("ses_b", 0, Some(claim));
        let txn = db.begin_write().expect("txn");
        {
            let mut sessions = txn.open_table(SESSIONS).expect("sessions");
            for row in [&a, &b] {
                let bytes = encode(row);
                sessions
                    .insert(row.id.as_str(), bytes.as_slice())
                    .expect("insert");
            }
            let mut inbox = txn.open_table(legacy::INBOX).expect("inbox");
            let row = inbox_row(3, Delivery::Queue);
            inbox.insert(("ses_a", 3), row.as_slice()).expect("insert");
            let mut front = txn.open_table(legacy::INBOX_FRONT).expect("front");
            let row = inbox_row(1, Delivery::Steer);
            front
                .insert((7, "ses_a", 1), row.as_slice())
                .expect("insert");
            let mut claims = txn.open_table(legacy::CLAIMS).expect("claims");
            claims.insert("ses_b", ()).expect("insert");
            let mut pending = txn.open_table(legacy::PENDING).expect("pending");
            pending.insert("ses_a", ()).expect("insert");
        }
        into_records(&txn).expect("upgraded");
        txn.commit().expect("commit");

        let read = db.begin_read().expect("read");
        let sessions = read.open_table(SESSIONS).expect("sessions");
        let record = |s: &str| -> SessionRecord {
            let value = sessions.get(s).expect("get").expect("record");
            decode("session record", value.value()).expect("decode")
        };
        let mut inbox = Inbox::default();
        inbox.add(Seq(1));
        inbox.add(Seq(3));
        let expected_a = SessionRecord { row: a, inbox };
        assert_eq!(record("ses_a"), expected_a);
        let expected_b = SessionRecord {
            row: b,
            inbox: Inbox::default(),
        };
        assert_eq!(record("ses_b"), expected_b);
        let working = read.open_table(WORKING).expect("working");
        let listed: Vec<String> = working
            .iter()
            .expect("iter")
            .map(|e| e.expect("entry").0.value().to_owned())
            .collect();
        assert_eq!(listed, ["ses_a", "ses_b"]);
        for name in ["inbox", "inbox_front", "claims", "pending"] {
            let listed = read
                .list_tables()
                .expect("tables")
                .any(|t| t.name() == name);
            assert!(!listed, "{name} is deleted");
        }
    }
}
