//! gRPC services: [`metad`] (the metadata API) and [`raft`] (peer messages), and the
//! [`convert`]ers between wire and core types, and the data-plane [`grants`] they sign.

pub mod convert;
pub mod grants;
pub mod metad;
pub mod raft;
