//! One agent per run directory: an exclusive `flock` on `<run-dir>/egpud.lock`,
//! held for the agent's lifetime and dropped by the kernel when it dies.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "egpud.lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another egpud (pid {pid}) already serves run directory {run_dir}; stop it first, or give this one another --run-dir")]
    Held { run_dir: PathBuf, pid: String },
    #[error("cannot lock {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it releases the run directory.
#[derive(Debug)]
pub struct RunDirLock {
    _file: File,
}

impl RunDirLock {
    pub fn acquire(run_dir: &Path) -> Result<RunDirLock, LockError> {
        let path = run_dir.join(LOCK_FILE);
        let io = |source| LockError::Io { path: path.clone(), source };
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = if pid.trim().is_empty() { "unknown".to_string() } else { pid.trim().to_string() };
                return Err(LockError::Held { run_dir: run_dir.into(), pid });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(RunDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let l = RunDirLock::acquire(dir.path()).unwrap();
        let e = RunDirLock::acquire(dir.path()).unwrap_err();
        assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
        drop(l);
        RunDirLock::acquire(dir.path()).unwrap();
    }
}
