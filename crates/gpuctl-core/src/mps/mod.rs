//! CUDA MPS (Multi-Process Service): on a GPU under MPS the driver lists
//! `nvidia-cuda-mps-server`, which holds the GPU context, and (Volta and later) each client
//! in both the compute and the MPS process lists, each with its own memory. The server is
//! started by the control daemon, `nvidia-cuda-mps-control`, its parent, which takes commands
//! on a named pipe in its pipe directory. Ending the server ends every client of every user
//! on the GPU; NVIDIA's supported way to end one client is the daemon's `terminate_client`.

use serde::{Deserialize, Serialize};

/// The MPS server's program name.
pub const SERVER: &str = "nvidia-cuda-mps-server";
/// The MPS control daemon's program name.
pub const CONTROL: &str = "nvidia-cuda-mps-control";

/// A process's part in MPS on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `nvidia-cuda-mps-server`: its own memory is the shared context's overhead.
    Server,
    /// A CUDA process whose work the server runs (in the driver's MPS list).
    Client,
}

impl Role {
    /// Its part from what the driver lists and what the process calls itself: a client is
    /// in the MPS list; a server calls itself the server (whether it *is* the server is
    /// protection's question, judged by identity).
    pub fn of(in_mps_list: bool, comm: Option<&str>, argv0: Option<&str>) -> Option<Role> {
        if in_mps_list {
            Some(Role::Client)
        } else if names(SERVER, comm, argv0) {
            Some(Role::Server)
        } else {
            None
        }
    }

    /// "MPS server" or "MPS client", as a table says it.
    pub fn label(self) -> &'static str {
        match self {
            Role::Server => "MPS server",
            Role::Client => "MPS client",
        }
    }
}

/// Whether a process names itself `program`: by argv[0]'s basename where it has one, else by
/// its command name, whose 15 characters the server and the daemon share.
pub fn names(program: &str, comm: Option<&str>, argv0: Option<&str>) -> bool {
    match argv0 {
        Some(argv0) => argv0 == program,
        None => comm
            .is_some_and(|comm| comm == program || (comm.len() == 15 && program.starts_with(comm))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_in_the_mps_list_and_a_server_names_itself() {
        assert_eq!(Role::of(true, Some("python3"), None), Some(Role::Client));
        assert_eq!(
            Role::of(false, Some("nvidia-cuda-mps"), None),
            Some(Role::Server)
        );
        assert_eq!(
            Role::of(false, Some("x"), Some("nvidia-cuda-mps-server")),
            Some(Role::Server)
        );
        assert_eq!(Role::of(false, Some("nvidia-cuda-mp"), None), None);
        assert_eq!(Role::of(false, Some("python3"), Some("python3")), None);
        // The two share their 15-character command name: argv[0] tells them apart.
        let comm = Some("nvidia-cuda-mps");
        assert!(names(CONTROL, comm, None) && names(SERVER, comm, None));
        assert_eq!(Role::of(false, comm, Some(CONTROL)), None);
    }
}
