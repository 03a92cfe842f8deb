//! Secrets cross the bus as file descriptors (a pipe or a file the caller opened), so they never sit
//! in dbus-daemon's buffers or in a message a monitor could log. Reading is bounded in size and
//! time: a caller that sends a pipe and never closes it gets an error, not a stuck service.
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use dirseal::secret::Passphrase;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::{fstat, FileType, OFlags};
use rustix::io::Errno;
use zeroize::Zeroizing;

use crate::error::{Error, Result};

/// Longer than any password, PIN or recovery key a person types.
pub const MAX_SECRET: usize = 4096;
/// How long a caller has to finish writing a secret (or reading what we write).
const DEADLINE: Duration = Duration::from_secs(10);

fn check_kind(fd: &OwnedFd, what: &str) -> Result<()> {
    let st = fstat(fd).map_err(|e| Error::invalid(format!("{what}: cannot inspect the file descriptor: {e}")))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Fifo | FileType::Socket | FileType::RegularFile => Ok(()),
        other => Err(Error::invalid(format!(
            "{what}: the file descriptor is a {other:?}; pass a pipe, socket or regular file holding the secret"
        ))),
    }
}

/// Waits until `fd` is ready for `flags`, or fails once the deadline passed.
fn wait(fd: &OwnedFd, flags: PollFlags, deadline: Instant, what: &str) -> Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::invalid(format!(
                "{what}: timed out waiting on the file descriptor; write the whole secret and close your end"
            )));
        }
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
        let mut fds = [PollFd::new(fd, flags)];
        match poll(&mut fds, Some(&ts)) {
            Ok(n) if n > 0 => return Ok(()),
            Ok(_) | Err(Errno::INTR) => continue,
            Err(e) => return Err(Error::invalid(format!("{what}: waiting on the file descriptor failed: {e}"))),
        }
    }
}

fn set_nonblocking(fd: &OwnedFd, what: &str) -> Result<()> {
    let fl = rustix::fs::fcntl_getfl(fd).map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    rustix::fs::fcntl_setfl(fd, fl | OFlags::NONBLOCK).map_err(|e| Error::invalid(format!("{what}: {e}")))
}

/// Reads a whole secret from `fd` (to end of file), dropping one trailing newline so that
/// `echo secret` and a line from a password field give the same bytes. `what` names the argument
/// in errors; the secret itself is never in an error or a log.
pub fn read_secret(fd: OwnedFd, what: &str) -> Result<Passphrase> {
    read_secret_within(fd, what, DEADLINE)
}

fn read_secret_within(fd: OwnedFd, what: &str, limit: Duration) -> Result<Passphrase> {
    check_kind(&fd, what)?;
    set_nonblocking(&fd, what)?;
    let deadline = Instant::now() + limit;
    // Capacity for the limit plus one byte up front: the buffer never reallocates, so no copy of
    // the secret is left behind in freed memory.
    let mut buf = Zeroizing::new(vec![0u8; MAX_SECRET + 1]);
    let mut len = 0;
    loop {
        if len > MAX_SECRET {
            return Err(Error::invalid(format!("{what}: the secret is longer than {MAX_SECRET} bytes")));
        }
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(Errno::AGAIN) => wait(&fd, PollFlags::IN, deadline, what)?,
            Err(Errno::INTR) => {}
            Err(e) => return Err(Error::invalid(format!("{what}: reading the secret failed: {e}"))),
        }
    }
    if buf[..len].ends_with(b"\n") {
        len -= 1;
    }
    if len == 0 {
        return Err(Error::invalid(format!("{what}: the secret is empty")));
    }
    let mut out = Zeroizing::new(Vec::with_capacity(len));
    out.extend_from_slice(&buf[..len]);
    Ok(Passphrase::new(out))
}

/// Writes `bytes` (a secret the caller must see, such as a new recovery key) to the caller's `fd`.
pub fn write_secret(fd: OwnedFd, bytes: &[u8], what: &str) -> Result<()> {
    check_kind(&fd, what)?;
    set_nonblocking(&fd, what)?;
    let deadline = Instant::now() + DEADLINE;
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::write(fd.as_fd(), &bytes[done..]) {
            Ok(n) => done += n,
            Err(Errno::AGAIN) => wait(&fd, PollFlags::OUT, deadline, what)?,
            Err(Errno::INTR) => {}
            Err(e) => return Err(Error::invalid(format!("{what}: writing to the file descriptor failed: {e}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn err(r: Result<Passphrase>) -> Error {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    fn pipe_with(bytes: &[u8]) -> OwnedFd {
        let (r, w) = rustix::pipe::pipe().unwrap();
        let mut w = std::fs::File::from(w);
        w.write_all(bytes).unwrap();
        drop(w);
        r
    }

    #[test]
    fn reads_pipes_and_strips_one_newline() {
        assert_eq!(read_secret(pipe_with(b"pw\n"), "s").unwrap().as_bytes(), b"pw");
        assert_eq!(read_secret(pipe_with(b"pw\n\n"), "s").unwrap().as_bytes(), b"pw\n");
        assert_eq!(read_secret(pipe_with(b"a b"), "s").unwrap().as_bytes(), b"a b");
        let long = vec![b'x'; MAX_SECRET];
        assert_eq!(read_secret(pipe_with(&long), "s").unwrap().as_bytes().len(), MAX_SECRET);
    }

    #[test]
    fn refuses_empty_huge_and_odd_descriptors() {
        assert!(err(read_secret(pipe_with(b"\n"), "s")).message.contains("empty"));
        let big = vec![b'x'; MAX_SECRET + 1];
        let (r, w) = rustix::pipe::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            let mut w = std::fs::File::from(w);
            let _ = w.write_all(&big);
        });
        assert!(err(read_secret(r, "s")).message.contains("longer"));
        writer.join().unwrap();
        let dir = rustix::fs::open("/", OFlags::RDONLY | OFlags::DIRECTORY, rustix::fs::Mode::empty()).unwrap();
        assert_eq!(err(read_secret(dir, "s")).kind, crate::error::Kind::InvalidArgs);
    }

    #[test]
    fn a_pipe_left_open_times_out_instead_of_hanging() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        let t = Instant::now();
        let e = err(read_secret_within(r, "secret", Duration::from_millis(300)));
        assert!(e.message.contains("timed out"), "{e}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        drop(w);
    }
}
