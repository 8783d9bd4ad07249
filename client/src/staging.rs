//! Windows of the connection's staging area. Several requests may be in flight on one
//! connection, each with its own window; a window returns to the pool when dropped.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::{Error, Result};

/// Windows start on 64 KiB boundaries (checksum chunks; also keeps transfers page-aligned).
const ALIGN: u64 = 64 * 1024;

#[derive(Debug)]
pub struct Staging {
    capacity: u64,
    free: Mutex<BTreeMap<u64, u64>>,
    freed: Notify,
}

/// A reserved window; returned to the pool on drop.
#[derive(Debug)]
pub struct Window {
    pool: Arc<Staging>,
    pub offset: u64,
    pub len: u64,
    held: u64,
}

impl Drop for Window {
    fn drop(&mut self) {
        self.pool.release(self.offset, self.held);
    }
}

impl Staging {
    pub fn new(capacity: u64) -> Arc<Self> {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Arc::new(Self {
            capacity,
            free: Mutex::new(free),
            freed: Notify::new(),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// A window of `len` bytes, waiting for other requests to return theirs when needed.
    pub async fn alloc(self: &Arc<Self>, len: u64) -> Result<Window> {
        let held = len.max(1).div_ceil(ALIGN) * ALIGN;
        if held > self.capacity {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes exceed the staging area of {} bytes (raise local_buffer_size / staging_size, or use a registered buffer)",
                self.capacity
            )));
        }
        loop {
            let notified = self.freed.notified();
            if let Some(offset) = self.try_take(held) {
                return Ok(Window {
                    pool: self.clone(),
                    offset,
                    len,
                    held,
                });
            }
            notified.await;
        }
    }

    fn try_take(&self, held: u64) -> Option<u64> {
        let mut free = self.free.lock();
        let (&start, &end) = free.iter().find(|(s, e)| *e - *s >= held)?;
        free.remove(&start);
        if start + held < end {
            free.insert(start + held, end);
        }
        Some(start)
    }

    fn release(&self, offset: u64, held: u64) {
        let mut free = self.free.lock();
        let mut start = offset;
        let mut end = offset + held;
        if let Some((&ps, &pe)) = free.range(..offset).next_back() {
            if pe == offset {
                free.remove(&ps);
                start = ps;
            }
        }
        if let Some(&ne) = free.get(&end) {
            free.remove(&end);
            end = ne;
        }
        free.insert(start, end);
        drop(free);
        self.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn windows_are_disjoint_and_come_back() {
        let s = Staging::new(4 * ALIGN);
        let a = s.alloc(ALIGN + 1).await.unwrap();
        let b = s.alloc(ALIGN).await.unwrap();
        assert_eq!((a.offset, b.offset), (0, 2 * ALIGN));
        assert!(s.alloc(5 * ALIGN).await.is_err());
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.alloc(3 * ALIGN).await.unwrap().offset })
        };
        tokio::task::yield_now().await;
        drop(a);
        drop(b);
        assert_eq!(waiter.await.unwrap(), 0);
    }
}
