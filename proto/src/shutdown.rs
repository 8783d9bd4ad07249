//! [`Shutdown`]: how a task learns that its process is stopping (as mini-redis's
//! `shutdown.rs`): cheap to clone, checked with [`Shutdown::is_shutdown`], awaited with
//! [`Shutdown::wait`]. One [`ShutdownTrigger`] fires them all, once; dropping the trigger counts
//! as firing it, so no task waits forever on a process that is gone.

use tokio::sync::watch;

/// Fires every [`Shutdown`] made from it.
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// A task's view of the process's shutdown.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// A trigger and the first listener of it.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Starts the shutdown (again is harmless).
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    /// A listener that never fires (tools and tests that run until dropped).
    pub fn never() -> Shutdown {
        let (tx, rx) = watch::channel(false);
        // The sender is leaked on purpose: with it gone the receiver would report shutdown.
        std::mem::forget(tx);
        Shutdown { rx }
    }

    pub fn is_shutdown(&self) -> bool {
        *self.rx.borrow() || self.rx.has_changed().is_err()
    }

    /// Returns once the shutdown has started (at once if it already has).
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // An error means the trigger is gone: that is a shutdown too.
        let _ = rx.wait_for(|stopping| *stopping).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_trigger_wakes_every_listener_and_late_ones_return_at_once() {
        let (trigger, first) = channel();
        let second = trigger.subscribe();
        assert!(!first.is_shutdown());
        let waiting = tokio::spawn({
            let s = second.clone();
            async move { s.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished());
        trigger.trigger();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("task");
        assert!(first.is_shutdown() && second.is_shutdown());
        first.wait().await;
        trigger.subscribe().wait().await;
    }

    #[tokio::test]
    async fn a_dropped_trigger_counts_as_shutdown_and_never_does_not() {
        let (trigger, s) = channel();
        drop(trigger);
        assert!(s.is_shutdown());
        tokio::time::timeout(Duration::from_secs(5), s.wait())
            .await
            .expect("returns");
        let never = Shutdown::never();
        assert!(!never.is_shutdown());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), never.wait())
                .await
                .is_err()
        );
    }
}
