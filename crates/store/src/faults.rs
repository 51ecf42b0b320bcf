//! Storage faults, injected: a redb storage backend over a real file whose writes, syncs and
//! reads can be made to fail on demand, for the tests of how the store behaves when the disk
//! fails or fills. Available with the `faults` feature (and in this crate's own tests).

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

/// A failure to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `EIO`: the device failed.
    Io,
    /// `ENOSPC`: the disk is full.
    NoSpace,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::Io => 1,
            Fault::NoSpace => 2,
        }
    }

    fn error(code: u8) -> Option<io::Error> {
        match code {
            1 => Some(io::Error::other("Input/output error (injected)")),
            2 => Some(io::Error::new(
                io::ErrorKind::StorageFull,
                "No space left on device (injected)",
            )),
            _ => None,
        }
    }
}

/// Which operations fail now. Shared between a test and the backend it armed.
#[derive(Debug, Default)]
pub struct Faults {
    write: AtomicU8,
    sync: AtomicU8,
    read: AtomicU8,
}

impl Faults {
    /// Writes (and growing the file) fail with `fault` until cleared.
    pub fn fail_writes(&self, fault: Fault) {
        self.write.store(fault.code(), Ordering::SeqCst);
    }

    /// Syncs fail with `fault` until cleared.
    pub fn fail_syncs(&self, fault: Fault) {
        self.sync.store(fault.code(), Ordering::SeqCst);
    }

    /// Reads fail with `fault` until cleared.
    pub fn fail_reads(&self, fault: Fault) {
        self.read.store(fault.code(), Ordering::SeqCst);
    }

    /// Everything works again.
    pub fn clear(&self) {
        for slot in [&self.write, &self.sync, &self.read] {
            slot.store(0, Ordering::SeqCst);
        }
    }

    /// Fails as a write would now.
    pub(crate) fn check_write(&self) -> io::Result<()> {
        Faults::check(&self.write)
    }

    pub(crate) fn check_sync(&self) -> io::Result<()> {
        Faults::check(&self.sync)
    }

    pub(crate) fn check_read(&self) -> io::Result<()> {
        Faults::check(&self.read)
    }

    fn check(slot: &AtomicU8) -> io::Result<()> {
        match Fault::error(slot.load(Ordering::SeqCst)) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
