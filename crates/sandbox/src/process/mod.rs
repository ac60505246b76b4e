//! Process isolation: each script's VM runs in a worker process under no_new_privs, a seccomp
//! allow-list, Landlock and resource limits, while the host keeps every authority.

mod entry;
pub(crate) mod host;
pub(crate) mod layers;
mod nudge;
pub(crate) mod worker;

pub(crate) use entry::link_entry;
