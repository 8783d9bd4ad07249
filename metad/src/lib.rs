//! regolith-metad: one replica of the metadata service.
