//! Raft persistence for Regolith: openraft 0.9 `RaftLogStorage` and `RaftStateMachine` on sled.
//!
//! The crate knows openraft and sled, not Regolith's commands: the application plugs its state
//! machine in through [`StateMachineCore`].
//!
//! Modules (see each for details):
//! * `core` — the [`StateMachineCore`] trait the application implements.

mod core;

pub use crate::core::StateMachineCore;
