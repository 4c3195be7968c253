//! Descriptors passed over a Unix socket (SCM_RIGHTS). Receiving one is the step neither std (its
//! ancillary-data API is unstable) nor nix (it hands back raw numbers) makes safe: here the
//! numbers the kernel installed become `OwnedFd`s at once, so no caller holds a raw one.

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Receives into `buf` from the connected Unix stream socket `s`: how many bytes came (0: the
/// peer hung up), and the descriptors passed with them, received close-on-exec (no child
/// inherits one). There is room for one descriptor; the kernel closes any more it was sent.
pub(crate) fn recv_with_fds(s: impl AsFd, buf: &mut [u8]) -> nix::Result<(usize, Vec<OwnedFd>)> {
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(s.as_fd().as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: each number is a descriptor the kernel has just installed in this
            // process's table for this message; nothing else knows it, so it is owned here once.
            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{ControlMessage, sendmsg};
    use std::io::IoSlice;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;

    /// A descriptor sent with a message arrives owned, close-on-exec, and is the same file; a
    /// message with none gives none (the control: same bytes, no descriptor).
    #[test]
    fn a_passed_descriptor_arrives_owned_and_close_on_exec() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        let fds = [file.as_raw_fd()];
        let rights = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(a.as_raw_fd(), &[IoSlice::new(b"one\n")], &rights, MsgFlags::empty(), None).unwrap();
        let mut buf = [0u8; 16];
        let (n, got) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], got.len()), (&b"one\n"[..], 1));
        let received = std::fs::File::from(got.into_iter().next().unwrap());
        assert_eq!(received.metadata().unwrap().ino(), file.metadata().unwrap().ino());
        let flags = nix::fcntl::fcntl(&received, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "received close-on-exec");
        sendmsg::<()>(a.as_raw_fd(), &[IoSlice::new(b"two\n")], &[], MsgFlags::empty(), None).unwrap();
        let (n, got) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], got.len()), (&b"two\n"[..], 0));
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut buf).unwrap().0, 0, "hung up");
    }
}
