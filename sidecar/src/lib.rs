//! regolith-sidecar: the node's memory segment and the data plane.
