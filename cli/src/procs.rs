//! The child processes of `regolith up`: spawned in their own process group (a terminal's
//! Ctrl-C reaches `up` alone, which stops them in order) with a parent-death signal (they go
//! too if `up` is killed), output appended to a log file, stopped with SIGTERM then, past a
//! deadline, SIGKILL.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{Error, Result};

pub struct Proc {
    /// `metad-1`, `node-0`, ...
    pub name: String,
    pub log: PathBuf,
    child: Child,
    status: Option<ExitStatus>,
}

/// How to start one child.
pub struct Spec<'a> {
    pub name: String,
    pub bin: &'a Path,
    pub args: Vec<OsString>,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(spec: Spec<'_>) -> Result<Proc> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|source| Error::File {
                what: "cannot open the log file",
                path: spec.log.clone(),
                source,
            })?;
        let log2 = log.try_clone()?;
        let mut cmd = Command::new(spec.bin);
        cmd.args(&spec.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        // The children get their settings from flags alone: an operator's exported
        // REGOLITH_SOCKET, REGOLITH_CONFIG, ... and RUST_LOG are meant for this command, not
        // for them (they log at their default level; `regolith -vv up` passes them -v).
        cmd.env_remove("RUST_LOG").env("NO_COLOR", "1");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("REGOLITH_") {
                cmd.env_remove(k);
            }
        }
        // SAFETY: the closure runs in the forked child before exec and calls only prctl(2)
        // through nix, which is async-signal-safe; it allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|e| {
            Error::Startup(format!(
                "cannot start {} ({}): {e}",
                spec.name,
                spec.bin.display()
            ))
        })?;
        tracing::debug!(name = %spec.name, pid = child.id(), log = %spec.log.display(), "started");
        Ok(Proc {
            name: spec.name,
            log: spec.log,
            child,
            status: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status once the process has ended (reaped here), else None.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
            }
        }
        self.status
    }

    pub fn signal(&mut self, sig: Signal) {
        if self.exited().is_none() {
            let _ = kill(Pid::from_raw(self.pid() as i32), sig);
        }
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// What stopping a group of processes came to.
#[derive(Debug, Default)]
pub struct Stopped {
    /// Processes that had to be killed after the deadline.
    pub killed: Vec<String>,
    /// Processes that exited with a failure status.
    pub failed: Vec<String>,
}

/// SIGTERM to every process of `procs`, then waits up to `timeout` for all of them; whatever is
/// left gets SIGKILL. `hurry` is polled: once it answers true, the wait ends at once.
pub fn stop(procs: &mut [Proc], timeout: Duration, hurry: &mut dyn FnMut() -> bool) -> Stopped {
    for p in procs.iter_mut() {
        p.signal(Signal::SIGTERM);
    }
    let deadline = Instant::now() + timeout;
    while procs.iter_mut().any(|p| p.exited().is_none()) && Instant::now() < deadline {
        if hurry() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Stopped::default();
    for p in procs.iter_mut() {
        match p.exited() {
            None => {
                tracing::warn!(name = %p.name, "did not stop in time; killing it");
                p.signal(Signal::SIGKILL);
                let _ = p.child.wait();
                out.killed.push(p.name.clone());
            }
            Some(st) if !st.success() => {
                tracing::warn!(name = %p.name, status = %st, log = %p.log.display(), "exited with a failure");
                out.failed.push(p.name.clone());
            }
            Some(_) => tracing::info!(name = %p.name, "stopped"),
        }
    }
    out
}
