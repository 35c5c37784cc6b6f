//! The bottom layer: the Linux primitives the road is built on (pidfds, socket peers, /proc
//! file reads, poll, resource limits). Every other module may use this one; it uses none of
//! them, so no two modules import each other through it.

pub mod fds;
pub mod limits;
pub mod peer;
pub mod pidfd;
pub mod procfile;
