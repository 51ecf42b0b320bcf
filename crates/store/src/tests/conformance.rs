//! The embedded backend passes the conformance suite.

use std::sync::{Arc, Mutex};

use crate::conformance::Backend;
use crate::{Config, RedbStore, Store};

/// Fresh stores in temporary directories, kept until the test ends.
#[derive(Default)]
struct Redb {
    dirs: Mutex<Vec<(tempfile::TempDir, std::path::PathBuf)>>,
}

impl Backend for Redb {
    fn fresh(&self) -> Arc<dyn Store> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let mut config = Config::new(&path);
        // Fold often, so every check crosses both tiers of the log.
        config.fold_rows = 5;
        let store = RedbStore::open(config).expect("opens");
        self.dirs.lock().expect("lock").push((dir, path));
        Arc::new(store)
    }

    fn reopen(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        store.close();
        drop(store);
        let path = self
            .dirs
            .lock()
            .expect("lock")
            .last()
            .expect("a store")
            .1
            .clone();
        Arc::new(RedbStore::open(Config::new(path)).expect("reopens"))
    }
}

crate::conformance_tests!(Redb::default());
