//! gRPC services: [`metad`] (the metadata API) and [`raft`] (peer messages), and the
//! [`convert`]ers between wire and core types.

pub mod convert;
pub mod metad;
pub mod raft;
