//! What the launcher does, as root, to make the stand-ins look like a shared server's
//! processes: each under its scenario user (`users`), each in its scenario cgroup
//! (`cgroups`).

pub mod cgroups;
pub mod users;
