//! The process's limit of open files. A server holds a socket per connection and a load
//! generator one per session's event stream and request, so `serve`, `mock-provider` and
//! `loadtest` raise the soft limit to the hard one at start: many systems set the soft limit to
//! 1 024 for compatibility with `select`, which nothing here uses, and a server at that limit
//! stops accepting (the accept loop backs off) while a load generator's connects fail.

/// The soft limit to set, given the current soft and hard limits (`None`: unlimited), or
/// `None` when the soft limit is already as high as it may go.
fn raised(soft: Option<u64>, hard: Option<u64>) -> Option<u64> {
    match (soft, hard) {
        (None, _) => None,
        (Some(soft), Some(hard)) if soft >= hard => None,
        (Some(_), Some(hard)) => Some(hard),
        // An unlimited hard limit: as far as the kernel's own cap on a process's open files.
        (Some(soft), None) => Some(soft.max(kernel_cap())),
    }
}

/// `fs.nr_open`, the most open files the kernel lets a process have (1 048 576 by default).
fn kernel_cap() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// What [`raise`] found and left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    /// The soft limit at start (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit now.
    pub now: Option<u64>,
}

/// Raises the soft limit of open files to the hard limit; what it was and is. A refusal (a
/// system whose hard limit the kernel does not accept as a soft one) leaves it as it was.
#[cfg(unix)]
pub(crate) fn raise() -> Limit {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current;
    let Some(soft) = raised(limit.current, limit.maximum) else {
        return Limit {
            before,
            now: before,
        };
    };
    let mut wanted = limit;
    wanted.current = Some(soft);
    match setrlimit(Resource::Nofile, wanted) {
        Ok(()) => Limit {
            before,
            now: Some(soft),
        },
        Err(_) => Limit {
            before,
            now: before,
        },
    }
}

#[cfg(not(unix))]
pub(crate) fn raise() -> Limit {
    Limit {
        before: None,
        now: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_rises_to_the_hard_one_and_never_falls() {
        assert_eq!(raised(Some(1024), Some(524_288)), Some(524_288));
        assert_eq!(raised(Some(4096), Some(4096)), None);
        assert_eq!(raised(Some(8192), Some(4096)), None);
        assert_eq!(raised(None, None), None);
        assert_eq!(raised(None, Some(4096)), None);
        let unlimited = raised(Some(1024), None).expect("raised");
        assert!(unlimited >= 1024);
        assert_eq!(raised(Some(u64::MAX), None), Some(u64::MAX));
    }
}
