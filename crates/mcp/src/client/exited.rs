//! Noticing that a server process exited, though its stdout stays open.
//!
//! The end of a stdio server's output is how rmcp learns the server is gone. A process the
//! server started (a helper, a daemon, `cmd &` in a launcher script) inherits that output and
//! keeps it open after the server exits: no end ever comes, every call waits for its timeout,
//! and the server is never started again. A pidfd says when the server itself exited.

use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Resolves once the process `pid` exited, without reaping it. `pid` must be an unreaped child
/// of this process, so that it names no other process. `None` where the kernel has no pidfds
/// (before Linux 5.3): then only the end of the output says the server stopped.
pub(crate) fn exit_of(pid: u32) -> Option<impl Future<Output = ()> + Send + 'static> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::debug!(pid, error = %e, "no pidfd for an MCP server; its exit is seen at the end of its output");
            return None;
        }
    };
    // SAFETY: the AsyncFd owns the descriptor, which nothing else closes or replaces.
    let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()?;
    Some(async move {
        // A pidfd turns readable when its process exits; an error would leave only the end of
        // the output, as without pidfds.
        match fd.readable().await {
            Ok(_) => {}
            Err(_) => std::future::pending().await,
        }
    })
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: the descriptor was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn resolves_when_the_process_exits_and_not_before() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("0.5")
            .spawn()
            .unwrap();
        let exit = exit_of(child.id().unwrap()).expect("this kernel has pidfds");
        let mut exit = std::pin::pin!(exit);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut exit)
                .await
                .is_err(),
            "resolved while the process ran"
        );
        tokio::time::timeout(Duration::from_secs(10), exit)
            .await
            .expect("resolves once the process exited");
        child.wait().await.unwrap();
    }
}
