//! The store's file backend for redb: the file, plus what the store needs to know about its
//! failures. A failed sync is marked ([`SyncFailed`]), whatever its error code: after a failed
//! fsync the kernel may have dropped pages it had said were written, so the store must stop
//! writing (see `slot`), while a full disk on a write is only a refusal. In tests it also injects
//! faults (see `faults`).

use std::fs::File;
use std::io;
use std::ops::Bound;
#[cfg(any(test, feature = "faults"))]
use std::sync::Arc;

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// The error of a failed sync, inside the `io::Error` redb passes on.
#[derive(Debug, thiserror::Error)]
#[error("sync failed: {0}")]
pub(crate) struct SyncFailed(pub(crate) io::Error);

/// Whether `e` is (or wraps) a failed sync.
pub(crate) fn sync_failed(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<SyncFailed>())
}

#[derive(Debug)]
pub(crate) struct Storage {
    inner: FileBackend,
    #[cfg(any(test, feature = "faults"))]
    faults: Option<Arc<crate::faults::Faults>>,
}

impl Storage {
    pub(crate) fn new(
        file: File,
        #[cfg(any(test, feature = "faults"))] faults: Option<Arc<crate::faults::Faults>>,
    ) -> Result<Self, redb::DatabaseError> {
        Ok(Storage {
            inner: FileBackend::new(file)?,
            #[cfg(any(test, feature = "faults"))]
            faults,
        })
    }

    #[cfg(any(test, feature = "faults"))]
    fn inject(&self, check: fn(&crate::faults::Faults) -> io::Result<()>) -> io::Result<()> {
        match &self.faults {
            Some(faults) => check(faults),
            None => Ok(()),
        }
    }
}

impl StorageBackend for Storage {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        #[cfg(any(test, feature = "faults"))]
        self.inject(crate::faults::Faults::check_read)?;
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        #[cfg(any(test, feature = "faults"))]
        self.inject(crate::faults::Faults::check_write)?;
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        #[cfg(any(test, feature = "faults"))]
        let injected = self.inject(crate::faults::Faults::check_sync);
        #[cfg(not(any(test, feature = "faults")))]
        let injected = Ok(());
        injected
            .and_then(|()| self.inner.sync_data())
            .map_err(|e| io::Error::new(e.kind(), SyncFailed(e)))
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        #[cfg(any(test, feature = "faults"))]
        self.inject(crate::faults::Faults::check_write)?;
        self.inner.write(offset, data)
    }

    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
}
